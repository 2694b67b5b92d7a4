// SPDX-License-Identifier: Apache-2.0

package perftest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParsePerftest(t *testing.T) {
	cases := []struct {
		desc    string
		out     string
		gbps    float64
		iters   int
		typical float64
		wantErr string
	}{
		{
			desc: "final CSV line, MiB/s to GB/s",
			out: "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n" +
				" 200,463.622,513.960,513.960,7782.70,7782.70,1946,1946\n",
			gbps: 7782.70 * 1048576 / 1e9, iters: 200, typical: 463.622,
		},
		{
			desc: "tag_lat: the median, one way",
			out: "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n" +
				"10000,0.420,4.743,153.812,1.61,0.05,210850,6501\n",
			gbps: 0.05 * 1048576 / 1e9, iters: 10000, typical: 0.420,
		},
		{
			desc: "no median column (an older ucx_perftest)",
			out:  "iterations,avg_lat,overall_bw\n10,1.5,100\n",
			gbps: 100 * 1048576 / 1e9, iters: 10,
		},
		{desc: "garbage median", out: "iterations,50.0_percentile_lat,avg_lat,overall_bw\n10,x,1.0,100\n", wantErr: "median latency"},
		{
			desc: "warnings before the header",
			out: "[1795352351.596463] [vm:21412:0] parser.c:1911 UCX WARN unused env variable\n" +
				"iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n" +
				"  20,8.855,10.753,10.753,90.82,90.82,93000,93000\n",
			gbps: 90.82 * 1048576 / 1e9, iters: 20, typical: 8.855,
		},
		{desc: "connect refused", out: "UCX  ERROR client failed. connect() failed: Connection refused\n", wantErr: "no final figures in ucx_perftest output: UCX  ERROR client failed"},
		{desc: "header only", out: "iterations,avg_lat,overall_bw\n", wantErr: "no final figures"},
		{desc: "garbage figures", out: "iterations,avg_lat,overall_bw\nx,y,z\n", wantErr: "ucx_perftest output"},
		{desc: "zero bandwidth", out: "iterations,avg_lat,overall_bw\n10,1.0,0\n", wantErr: "bandwidth of 0"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			res, err := parse(tc.out)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.InDelta(t, tc.gbps, res.GBps, 1e-9)
			require.Equal(t, tc.iters, res.Iters)
			require.InDelta(t, tc.typical, res.TypicalLatencyUs, 1e-9)
		})
	}
}

func TestPerftestItersAreBounded(t *testing.T) {
	cases := []struct {
		desc         string
		size, target int64
		iters        int
	}{
		{"tiny messages cap at 100000", 8, 1 << 40, 100000},
		{"huge messages floor at 10", 1 << 30, 1 << 30, 10},
		{"target over size", 4 << 20, 2 << 30, 512},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			n, w := Iters(tc.size, tc.target)
			require.Equal(t, tc.iters, n)
			require.GreaterOrEqual(t, w, 2)
			require.LessOrEqual(t, w, 1000)
		})
	}
}

// The real ucx_perftest, briefly, over shared memory between two processes on this host.
func TestRealPerftestBaseline(t *testing.T) {
	bin, err := Find()
	if err != nil {
		t.Skipf("ucx_perftest is not installed (Debian package ucx-utils): %v", err)
	}
	res, err := Run(context.Background(), Config{
		Binary: bin, Test: "tag_bw", Size: 1 << 20, TLS: "shm,self", Iters: 200, Warmup: 20, Timeout: 30 * time.Second,
	})
	require.NoError(t, err)
	require.Greater(t, res.GBps, 0.05, "1 MiB messages over shared memory")
	require.Equal(t, 200, res.Iters)
}

// A measurement as kvxfer's engines run UCX gives both ends peer error handling (-e) and the
// engine's settings, which win over the caller's environment.
func TestPerftestRunsBothEndsWithTheSettingsAsked(t *testing.T) {
	cases := []struct {
		desc     string
		cfg      Config
		wantE    bool
		wantSegs string
	}{
		{desc: "as UCX comes", cfg: Config{TLS: "tcp,self"}, wantSegs: "8k"},
		{desc: "as the engine runs it", cfg: Config{TLS: "tcp,self", ErrorHandling: true,
			Env: []string{"UCX_TCP_TX_SEG_SIZE=1m", "UCX_TCP_MAX_IOV=0"}}, wantE: true, wantSegs: "1m"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			t.Setenv("UCX_TCP_TX_SEG_SIZE", "8k") // the caller's
			dir := t.TempDir()
			fake := filepath.Join(dir, "ucx_perftest")
			// Each end writes its arguments and UCX settings to a file of its own; the client
			// then prints a report.
			script := "#!/bin/sh\nend=server\nif [ \"$1\" = 127.0.0.1 ]; then end=client; fi\n" +
				"echo \"args $*\" > " + dir + "/$end.tmp\n" +
				"env | grep '^UCX_' | sort >> " + dir + "/$end.tmp\nmv " + dir + "/$end.tmp " + dir + "/$end\n" +
				"if [ $end = client ]; then echo 'iterations,50.0_percentile_lat,avg_lat,overall_bw'; echo '10,4.5,5.0,100'; " +
				"else sleep 0.3; fi\n"
			require.NoError(t, os.WriteFile(fake, []byte(script), 0o755))
			cfg := tc.cfg
			cfg.Binary, cfg.Test, cfg.Size, cfg.Iters, cfg.Warmup, cfg.Timeout = fake, "tag_lat", 4096, 10, 2, 30*time.Second
			res, err := Run(context.Background(), cfg)
			require.NoError(t, err)
			require.InDelta(t, 4.5, res.TypicalLatencyUs, 1e-9)
			for _, end := range []string{"server", "client"} {
				var seen []byte
				require.Eventually(t, func() bool { seen, err = os.ReadFile(filepath.Join(dir, end)); return err == nil },
					20*time.Second, 10*time.Millisecond, "the %s ran", end)
				lines := strings.Split(strings.TrimSpace(string(seen)), "\n")
				args := strings.Fields(lines[0])
				require.Equal(t, tc.wantE, slices.Contains(args, "-e"), "%s: %s", end, lines[0])
				require.Contains(t, lines, "UCX_TLS=tcp,self", end)
				require.Contains(t, lines, "UCX_TCP_TX_SEG_SIZE="+tc.wantSegs, end)
				for _, kv := range tc.cfg.Env {
					require.Contains(t, lines, kv, end)
				}
			}
		})
	}
}

// A perftest that never finishes is killed, with its process group, when the timeout passes,
// and the error says so.
func TestPerftestTimeoutLeavesNoProcess(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pids")
	fake := filepath.Join(dir, "ucx_perftest")
	// Server and client both hang; each records its pid (and starts a child that would
	// outlive a kill of the parent alone).
	script := "#!/bin/sh\necho $$ >> " + pidFile + "\nsleep 60 &\necho $! >> " + pidFile + "\nwait\n"
	require.NoError(t, os.WriteFile(fake, []byte(script), 0o755))
	start := time.Now()
	_, err := Run(context.Background(), Config{
		Binary: fake, Test: "tag_bw", Size: 4096, Iters: 10, Warmup: 2, Timeout: 500 * time.Millisecond,
	})
	require.ErrorContains(t, err, "did not finish in 500ms")
	require.Less(t, time.Since(start), 10*time.Second)
	pids, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	var n int
	for _, f := range strings.Fields(string(pids)) {
		n++
		pid, err := strconv.Atoi(f)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return syscall.Kill(pid, 0) == syscall.ESRCH || isZombie(pid) },
			5*time.Second, 20*time.Millisecond, "pid %d still runs", pid)
	}
	require.GreaterOrEqual(t, n, 4, "server, client and their children recorded their pids")
}

// A client that fails for another reason than a refused connection is reported at once with
// its output.
func TestPerftestClientFailureIsReported(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "ucx_perftest")
	// As server (no host argument) sleep briefly; as client fail with a message.
	script := "#!/bin/sh\nif [ \"$1\" = 127.0.0.1 ]; then echo 'UCX ERROR no such transport: bogus' >&2; exit 1; fi\nsleep 0.2\n"
	require.NoError(t, os.WriteFile(fake, []byte(script), 0o755))
	_, err := Run(context.Background(), Config{
		Binary: fake, Test: "tag_bw", Size: 4096, TLS: "bogus", Iters: 10, Warmup: 2, Timeout: 5 * time.Second,
	})
	require.ErrorContains(t, err, "ucx_perftest client failed")
	require.ErrorContains(t, err, "no such transport: bogus")
}

// isZombie reports whether pid has exited but not been reaped by its parent (a child of the
// shell script reparented to init may linger as a zombie for a moment).
func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	fields := strings.Fields(string(b))
	return len(fields) > 2 && fields[2] == "Z"
}
