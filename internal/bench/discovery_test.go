// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/registryserver"
	"github.com/kvxfer/kvxfer/transfer/discovery"
)

// A serve's registry entry carries the engine wire versions and features of this build, so a
// peer can tell what it will meet before it connects.
func TestPublishServe_EntryCarriesTheWireProtocol(t *testing.T) {
	reg, err := registryserver.Serve("127.0.0.1:0")
	require.NoError(t, err)
	defer reg.Close(context.Background())
	d := Discovery{Target: reg.URL(), Name: "prefill-w"}
	withdraw, err := publishServe(context.Background(), d, "127.0.0.1:7400", "")
	require.NoError(t, err)
	defer withdraw()

	r, err := discovery.Open(reg.URL(), discovery.Config{})
	require.NoError(t, err)
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := r.Lookup(ctx, "prefill-w")
	require.NoError(t, err)
	build := discovery.BuildProtocol()
	require.Equal(t, build.Version, w.Protocol.Version)
	require.Equal(t, build.MinVersion, w.Protocol.MinVersion)
	require.Contains(t, w.Protocol.Features, "rma")
	require.Contains(t, w.Protocol.Features, "streaming")
}
