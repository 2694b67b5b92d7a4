// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/bench"
	"github.com/kvxfer/kvxfer/internal/bench/perftest"
	"github.com/kvxfer/kvxfer/internal/registryserver"
)

// engineBuilt: this build moves transfers (bench.EngineBuilt), so a connect measures.
var engineBuilt = bench.EngineBuilt()

// startServe runs `kvxbench serve` in-process and returns the address it printed, and a
// channel with its exit code and stderr.
func startServe(t *testing.T, args ...string) (string, <-chan [2]string) {
	t.Helper()
	pr, pw := io.Pipe()
	done := make(chan [2]string, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	go func() {
		defer cancel()
		var stdout strings.Builder
		code := Main(ctx, append([]string{"serve", "--listen", "127.0.0.1:0", "--wait", "10s"}, args...), &stdout, pw)
		pw.Close()
		done <- [2]string{strconv.Itoa(code), stdout.String()}
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err)
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	m := regexp.MustCompile(`serving on (127\.0\.0\.1:\d+)`).FindStringSubmatch(line)
	require.NotNil(t, m, "serve printed %q", line)
	return m[1], done
}

// serve and connect meet over the control connection and check each other's version and
// layout before anything else.
func TestServeAndConnect(t *testing.T) {
	cases := []struct {
		desc        string
		serveArgs   []string
		connectArgs []string
		want        string
	}{
		{"same layout, no engine in this build", nil, nil, "the transfer engine"},
		{"other head count", []string{"--heads", "4"}, nil, "peer's KV layout is incompatible: kvxfer: incompatible plans: Heads"},
		{"other block size", nil, []string{"--tokens-per-block", "16"}, "TokensPerBlock"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			if engineBuilt && tc.connectArgs == nil && tc.serveArgs == nil {
				t.Skip("this build has the engine: TestServeAndConnectMeasure covers the same layout")
			}
			addr, served := startServe(t, append([]string{"--layers", "2", "--prompts", "64", "--concurrency", "1"}, tc.serveArgs...)...)
			args := append([]string{"connect", "--layers", "2", "--prompts", "64", "--concurrency", "1", "--baseline=false"}, tc.connectArgs...)
			code, stdout, stderr := runMain(t, 30*time.Second, append(args, addr)...)
			require.Equal(t, exitError, code)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tc.want)
			select {
			case res := <-served:
				require.Equal(t, "1", res[0], "serve fails too")
			case <-time.After(20 * time.Second):
				t.Fatal("serve did not end")
			}
		})
	}
}

// connect to a port that accepts and says nothing ends after --connect-timeout.
func TestConnectToASilentPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- conn // held open, silent, until the test ends
	}()
	defer func() {
		if conn, ok := <-accepted; ok {
			conn.Close()
		}
	}()
	start := time.Now()
	code, _, stderr := runMain(t, 20*time.Second, "connect", "--connect-timeout", "300ms", "--baseline=false", ln.Addr().String())
	require.Equal(t, exitError, code)
	require.Contains(t, stderr, "sent nothing within 300ms")
	// Well short of runMain's 20s: the 300ms bound ended it, with room for a loaded host's
	// stall (2s was not: a -race run under load can stall the process that long).
	require.Less(t, time.Since(start), 10*time.Second)
}

// With the engine in the build, serve and connect measure a small scenario end to end, the
// baseline's server started on the serve side over the control connection.
func TestServeAndConnectMeasure(t *testing.T) {
	skipWithoutHostCopy(t)
	if !engineBuilt {
		t.Skip("this build has no transfer engine: TestServeAndConnect covers what it can do")
	}
	small := []string{"--layers", "2", "--prompts", "64", "--concurrency", "1", "--slot-size", "256KiB", "--max-memory", "256MiB", "--duration", "20ms"}
	addr, served := startServe(t, small...)
	args := append(append([]string{"connect", "--json"}, small...), addr)
	if _, err := perftest.Find(); err != nil {
		args = append([]string{"connect", "--json", "--baseline=false"}, append(small, addr)...)
	}
	code, stdout, stderr := runMain(t, 60*time.Second, args...)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, `"verified":true`)
	select {
	case res := <-served:
		require.Equal(t, "0", res[0])
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not end")
	}
}

// serve listens on loopback unless told otherwise, and with --http its probes answer from
// the start, before any connect: live, not ready, with the reason.
func TestServeProbesAnswerFromStart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	httpAddr := ln.Addr().String()
	require.NoError(t, ln.Close())
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		var stdout strings.Builder
		done <- Main(ctx, []string{"serve", "--wait", "20s", "--http", httpAddr, "--layers", "2", "--prompts", "64", "--concurrency", "1"}, &stdout, pw)
		pw.Close()
	}()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("serve did not end after the interrupt")
		}
	}()
	r := bufio.NewReader(pr)
	var serving string
	for serving == "" {
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		if m := regexp.MustCompile(`serving on (\S+);`).FindStringSubmatch(line); m != nil {
			serving = m[1]
		}
	}
	go func() { _, _ = io.Copy(io.Discard, r) }()
	host, _, err := net.SplitHostPort(serving)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", host, "serve defaults to loopback")

	get := func(path string) (int, string) {
		c := http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get("http://" + httpAddr + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, _ := get("/livez")
	require.Equal(t, http.StatusOK, code, "live before any peer")
	code, body := get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, "not ready before the engine exists")
	require.Contains(t, body, "waiting for kvxbench connect")
	code, _ = get("/healthz")
	require.Equal(t, http.StatusServiceUnavailable, code)
}

// serve publishes its control address in a registry and connect finds it there by name,
// with no address passed by hand.
func TestServeAndConnectThroughDiscovery(t *testing.T) {
	reg, err := registryserver.Serve("127.0.0.1:0")
	require.NoError(t, err)
	defer reg.Close(context.Background())
	small := []string{"--layers", "2", "--prompts", "64", "--concurrency", "1", "--slot-size", "256KiB", "--max-memory", "256MiB", "--duration", "20ms"}
	_, served := startServe(t, append([]string{"--discovery", reg.URL(), "--name", "prefill-a"}, small...)...)
	args := append([]string{"connect", "--json", "--baseline=false", "--discovery", reg.URL(), "--peer", "prefill-a"}, small...)
	code, stdout, stderr := runMain(t, 60*time.Second, args...)
	if !engineBuilt {
		// Without the engine the two ends still meet, then stop after the hello.
		require.Equal(t, exitError, code)
		require.Contains(t, stderr, "the transfer engine")
	} else {
		require.Equal(t, exitOK, code, stderr)
		require.Contains(t, stdout, `"verified":true`)
	}
	select {
	case <-served:
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not end")
	}
	// serve withdrew on exit; a connect looking for it now gives up within its timeout.
	code, _, stderr = runMain(t, 20*time.Second, "connect", "--connect-timeout", "200ms", "--baseline=false",
		"--discovery", reg.URL(), "--peer", "prefill-a")
	require.Equal(t, exitError, code)
	require.Contains(t, stderr, "did not appear")
	code, _, stderr = runMain(t, 20*time.Second, "connect", "--discovery", reg.URL(), "127.0.0.1:1")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "not both")
}

func TestConnectToNothingIsUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	code, stdout, stderr := runMain(t, 20*time.Second, "connect", "--connect-timeout", "1s", addr)
	require.Equal(t, exitError, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "peer does not answer: no kvxbench serve answers at "+addr)
}
