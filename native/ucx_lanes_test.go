// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// What UCX says about a fresh endpoint's lanes, before any message: shared memory serves gets
// itself in UCX 1.13, TCP has them emulated with active messages. UCX 1.22 (protocols v2)
// gives an endpoint with peer error handling no RMA lane over shared memory either (it wants
// UCT_MD_FLAG_INVALIDATE_RMA of the memory domain, which posix and cma lack): its gets are
// emulated there too, which ucx.Transport.GetsEmulated knows to look past (docs/ucx.md).
func TestUCX_EndpointLanesNameNativeGets(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			p := newPair(t, tr.tls)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			l, err := p.ab.Lanes(ctx)
			require.NoError(t, err)
			require.NotEmpty(t, l.Transports)
			require.True(t, strings.HasPrefix(l.Transports[0], tr.lane), "%v", l.Transports)
			require.Equal(t, tr.name == "shm" && !protocolsV2(), l.NativeGet, "%+v (UCX %s)", l, UCXVersion())
		})
	}
}
