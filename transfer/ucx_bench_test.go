// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/peerproc"
)

// BenchmarkUCXTransport_Request4096Tokens_TwoProcesses moves the Llama-3-8B 4096-token
// request (512 MiB) from this process's engine to an engine in an enginepeer process through
// the staging path (gather into a slot, tagged send, scatter), and reports the best request's
// bandwidth and ratio_to_perftest against the best ucx_perftest tag_bw run at the slot size
// over the same transport, one run after each of our requests.
//
//	go test -run '^$' -bench ucx.Transport -benchtime 3x ./transfer
func BenchmarkUCXTransport_Request4096Tokens_TwoProcesses(b *testing.B) {
	benchUCXRequest4096(b, PathStaging)
}

// BenchmarkUCXTransport_Request4096Tokens_TwoProcesses_RMA is the same request with both
// pools mapped by the transport, so the engines take the one-copy direct path in its RMA mode
// (the decode peer reads the prefill pool with gets, one per 4 MiB block); the baseline is
// ucx_perftest tag_bw at the direct path's chunk size (Config.Tuning.DirectChunkBytes, 64 MiB).
// The run fails if the transfer took any other path.
func BenchmarkUCXTransport_Request4096Tokens_TwoProcesses_RMA(b *testing.B) {
	benchUCXRequest4096(b, PathRMA)
}

func benchUCXRequest4096(b *testing.B, want Path) {
	const blocks = 256 // 4096 tokens of 16
	bin := peerproc.BuildEnginePeer(b)
	for _, tr := range ucxTransports {
		b.Run(tr.name, func(b *testing.B) {
			b.StopTimer()
			cfg := ucxTestConfig()
			cfg.SlotBytes = 4 << 20
			cfg.TransferTimeout = time.Minute
			message := cfg.SlotBytes
			if want != PathStaging {
				cfg = cfg.withDefaults()
				message = cfg.Tuning.DirectChunkBytes
			}
			local := newUCXEngine(b, tr.tls, tr.dev, cfg)
			args := append(ucxPeerArgs(tr.tls, tr.dev, "engine-recv", blocks, 1000, 5*time.Minute),
				"-repeat", strconv.Itoa(b.N), "-check=false", "-report", "0", "-chunk", strconv.FormatInt(4<<20, 10))
			if want != PathStaging {
				args = append(args, "-direct")
			}
			if want == PathRMA { // over TCP too, where the receiver would take messages by default
				args = append(args, "-rma-where-emulated")
			}
			peer := peerproc.Start(b, bin, args...)
			peer.Connect(b, string(local.tr.Self()))
			pool, plan := ucxEnginePool(b, blocks, 5, true)
			if want != PathStaging {
				mapped, err := local.tr.AllocatePool(int64(len(pool)))
				if err != nil {
					b.Fatal(err)
				}
				copy(mapped, pool)
				pool = mapped
			}
			b.SetBytes(plan.Bytes())
			best := time.Duration(1<<63 - 1)
			perf := 0.0
			b.StartTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				h, err := local.e.Send(bg, Spec{ID: RequestID(1000 + i), Peer: Peer(peer.Addr), Plan: plan, Pool: pool})
				if err != nil {
					b.Fatal(err)
				}
				<-h.Quiesced()
				if st := h.Status(); st.State != Completed {
					b.Fatalf("request %d: %v %v", i, st.State, st.Err)
				}
				best = min(best, time.Since(start))
				b.StopTimer()
				if got := h.Path(); got != want {
					b.Fatalf("request %d took the %v path, want %v", i, got, want)
				}
				if got := peer.Expect(b, "DONE ", time.Minute); got != Completed.String()+" OK" {
					b.Fatalf("peer: %s", got)
				}
				// ucx_perftest runs between our requests, so both see the same neighbours.
				p, err := ucxPerftestTagBW(tr.tls, tr.dev, message)
				if err != nil {
					b.Fatal(err)
				}
				perf = max(perf, p)
				b.StartTimer()
			}
			b.StopTimer()
			mibps := float64(plan.Bytes()) / best.Seconds() / (1 << 20)
			b.ReportMetric(mibps, "best_MiB/s")
			b.ReportMetric(perf, "perftest_MiB/s")
			b.ReportMetric(mibps/perf, "ratio_to_perftest")
		})
	}
}

// ucxPerftestTagBW runs ucx_perftest tag_bw between two processes on loopback and returns its
// overall bandwidth in MiB/s (its "MB" is 2^20 bytes).
func ucxPerftestTagBW(tls, dev string, size int64) (float64, error) {
	if _, err := exec.LookPath("ucx_perftest"); err != nil {
		return 0, fmt.Errorf("ucx_perftest not installed (Debian package ucx-utils): %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	env := append(os.Environ(), "UCX_TLS="+tls, "UCX_WARN_UNUSED_ENV_VARS=n")
	if dev != "" {
		env = append(env, "UCX_NET_DEVICES="+dev)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	server := exec.CommandContext(ctx, "ucx_perftest", "-p", port)
	server.Env = env
	if err := server.Start(); err != nil {
		return 0, err
	}
	defer func() { _ = server.Process.Kill(); _ = server.Wait() }()
	var out []byte
	for attempt := 0; attempt < 50; attempt++ {
		client := exec.CommandContext(ctx, "ucx_perftest", "127.0.0.1", "-p", port, "-t", "tag_bw",
			"-s", strconv.FormatInt(size, 10), "-n", strconv.Itoa(max(int((1<<30)/size), 64)), "-w", "16")
		client.Env = env
		if out, err = client.CombinedOutput(); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return 0, fmt.Errorf("ucx_perftest client: %v\n%s", err, out)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 9 && f[0] == "Final:" {
			return strconv.ParseFloat(f[6], 64)
		}
	}
	return 0, fmt.Errorf("no Final line in ucx_perftest output:\n%s", out)
}
