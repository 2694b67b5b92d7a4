// SPDX-License-Identifier: Apache-2.0

package observe_test

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/discovery"
	"github.com/kvxfer/kvxfer/transfer/observe"
)

// One listener serves the probes, the metrics and the embedded registry
// (HandlerConfig.Registry): a worker published through it is found through it, and paths that
// are neither the probes', the metrics' nor the registry's are 404.
func TestServe_OneMuxForProbesMetricsAndRegistry(t *testing.T) {
	src := observe.HealthFunc(func() transfer.Health { return transfer.Health{Healthy: true} })
	srv, err := observe.Serve("127.0.0.1:0", observe.HandlerConfig{
		Health: src, Gatherer: prometheus.NewRegistry(), Registry: discovery.Handler(),
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Close(context.Background())) })
	base := "http://" + srv.Addr()
	client := &http.Client{Timeout: waitBound}

	cases := []struct {
		desc string
		path string
		want int
	}{
		{"liveness probe", observe.LivezPath, http.StatusOK},
		{"readiness probe", observe.ReadyzPath, http.StatusOK},
		{"metrics", observe.MetricsPath, http.StatusOK},
		{"the registry's listing", discovery.WorkersPath + "?role=decode", http.StatusOK},
		{"an unknown worker", discovery.WorkersPath + "/nobody", http.StatusNotFound},
		{"a path of nobody's", "/v2/other", http.StatusNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			resp, err := client.Get(base + tc.path)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			require.NoError(t, resp.Body.Close())
			require.Equal(t, tc.want, resp.StatusCode)
		})
	}

	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	reg, err := discovery.Open(base, discovery.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, reg.Close()) })
	w := discovery.Worker{Name: "decode-0", Role: "decode", Incarnation: 7, Address: []byte{1, 2, 3},
		Protocol: discovery.BuildProtocol()}
	r, err := reg.Publish(ctx, w)
	require.NoError(t, err)
	got, err := reg.Lookup(ctx, "decode-0")
	require.NoError(t, err)
	require.Equal(t, w.Incarnation, got.Incarnation)
	require.NoError(t, r.Withdraw(ctx))
	_, err = reg.Lookup(ctx, "decode-0")
	require.ErrorIs(t, err, discovery.ErrNotFound)
}
