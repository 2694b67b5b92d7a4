// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// The constant package transport states on the engine's behalf, since it may not import the
// wire format, must be the engine's. (ucx's default staging size is computed from the engine's
// defaults, internal/transferdefaults.)
func TestContractConstantsAreTheEngines(t *testing.T) {
	require.Equal(t, wire.DataHeaderBytes, transport.DataHeaderBytes, "a data chunk's header, as the wire format makes it")
}
