// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// --http serves the decode engine's /healthz and /metrics while a run moves requests: the
// kvxfer_ series move during the benchmark, and the endpoint is gone when the run ends.
func TestRunHTTPServesHealthAndMovingMetrics(t *testing.T) {
	skipWithoutHostCopy(t)
	if !engineBuilt {
		t.Skip("kvxbench built without the UCX engine (no cgo): --http has no engine to expose")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	cfg := runFor(t, runSpec{layers: 4, prompts: []int64{256}, concurrency: []int{1}, slotBytes: 256 << 10, memCap: 512 << 20, http: addr})
	require.Equal(t, addr, cfg.HTTP)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Loopback(ctx, cfg, Output{Duration: 3 * time.Second, MaxIters: 100000}, "",
			&Outputs{Stdout: discard{}, Stderr: discard{}}, func(Result) error { return nil })
	}()

	get := func(path string) (int, string) {
		c := http.Client{Timeout: 2 * time.Second}
		resp, err := c.Get("http://" + addr + path)
		if err != nil {
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	sawBytes, sawHealthy := false, false
	for deadline := time.Now().Add(45 * time.Second); time.Now().Before(deadline) && !(sawBytes && sawHealthy); {
		if code, body := get("/metrics"); code == http.StatusOK {
			for _, line := range strings.Split(body, "\n") {
				if strings.HasPrefix(line, "kvxfer_transferred_bytes_total") && !strings.HasSuffix(line, " 0") {
					sawBytes = true
				}
			}
		}
		if code, _ := get("/healthz"); code == http.StatusOK {
			sawHealthy = true
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.True(t, sawHealthy, "/healthz answered 200 during the run")
	require.True(t, sawBytes, "kvxfer_transferred_bytes_total moved during the run")
	require.NoError(t, <-done)
	code, _ := get("/healthz")
	require.Zero(t, code, "the endpoint closes with the engine")
}
