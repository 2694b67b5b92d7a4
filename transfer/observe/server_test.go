// SPDX-License-Identifier: Apache-2.0

package observe_test

import (
	"context"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/observe"
)

func TestServe_ServesUntilClosed(t *testing.T) {
	var unhealthy atomic.Bool // written here, read by the server's goroutines
	src := observe.HealthFunc(func() transfer.Health {
		if !unhealthy.Load() {
			return transfer.Health{Healthy: true}
		}
		return transfer.Health{Reason: "no transfer progressed for 11s"}
	})
	srv, err := observe.Serve("127.0.0.1:0", observe.HandlerConfig{Health: src, Gatherer: prometheus.NewRegistry()})
	require.NoError(t, err)
	client := &http.Client{Timeout: waitBound}
	fetch := func() (int, string) {
		resp, err := client.Get("http://" + srv.Addr() + "/healthz")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	code, body := fetch()
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)
	unhealthy.Store(true)
	code, body = fetch()
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "no transfer progressed for 11s\n", body)
	client.CloseIdleConnections()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, srv.Close(ctx))
	_, err = client.Get("http://" + srv.Addr() + "/healthz")
	require.Error(t, err, "closed")
}

func TestServe_RefusesBadInput(t *testing.T) {
	cases := []struct {
		desc string
		addr string
		cfg  observe.HandlerConfig
	}{
		{"no health source", "127.0.0.1:0", observe.HandlerConfig{}},
		{"unusable address", "256.0.0.1:bad", observe.HandlerConfig{Health: observe.HealthFunc(func() transfer.Health { return transfer.Health{} })}},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			srv, err := observe.Serve(c.addr, c.cfg)
			require.Nil(t, srv)
			require.Error(t, err)
		})
	}
}
