// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// The constants packages transport and ucx state on the engine's behalf, since they may not
// import it, must be the engine's.
func TestContractConstantsAreTheEngines(t *testing.T) {
	require.Equal(t, transport.DataHeaderBytes, transport.DataHeaderBytes, "a data chunk's header, as the wire format makes it")
	require.EqualValues(t, defaultMaxConcurrent*defaultPipelineDepth*defaultSlotBytes, ucx.DefaultStagingBytes,
		"ucx's default staging region holds the engine's default staging pool")
}
