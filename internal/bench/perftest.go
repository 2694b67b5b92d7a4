// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/internal/peerproc/proc"
)

// perftestConfig is one ucx_perftest measurement between a server and a client on this host.
type perftestConfig struct {
	// binary is the ucx_perftest executable (found on PATH by FindPerftest).
	binary string
	// test is ucx_perftest's -t: tag_bw, the tagged send/receive our wire uses.
	test string
	// size is the message size (-s), the same as our wire messages.
	size int64
	// tls is UCX_TLS for both ends; empty leaves UCX's own choice (and the caller's
	// environment).
	tls string
	// memType is ucx_perftest's -m (memory type of both ends' buffers), such as "cuda" for
	// --memory device; empty leaves host memory.
	memType string
	// iters and warmup are -n and -w.
	iters, warmup int
	// timeout bounds the whole measurement, retries included; both processes are killed
	// with their process groups when it passes.
	timeout time.Duration
}

// perftestResult is what ucx_perftest reported.
type perftestResult struct {
	// GBps is the overall bandwidth in 10^9 bytes per second (ucx_perftest prints MiB/s).
	GBps float64
	// Iters is the iterations it reports having run.
	Iters int
	// AvgLatencyUs is its average time per message.
	AvgLatencyUs float64
}

// errNoPerftest means ucx_perftest is not installed: the baseline is skipped with a note, not
// an error, unless --baseline was asked for explicitly.
var errNoPerftest = errors.New("ucx_perftest not found on PATH (Debian package ucx-utils; `make deps` installs it)")

// FindPerftest returns the path of ucx_perftest, or errNoPerftest.
func FindPerftest() (string, error) {
	p, err := exec.LookPath("ucx_perftest")
	if err != nil {
		return "", errNoPerftest
	}
	return p, nil
}

// perftestIters picks -n so that one measurement moves about target bytes, at least 10
// messages and at most 100000, and -w a tenth of it.
func perftestIters(size, target int64) (iters, warmup int) {
	n := target / max(size, 1)
	iters = int(min(max(n, 10), 100000))
	warmup = min(max(iters/10, 2), 1000)
	return iters, warmup
}

// maxPortTries bounds how often a measurement is restarted on a fresh port when the server
// could not bind the one it was given (another process took it between our probe and its
// bind).
const maxPortTries = 3

// runPerftest runs ucx_perftest's server and client on 127.0.0.1 and returns the client's
// final figures. It never leaves a process behind: each end runs in its own process group,
// killed when the measurement ends or its timeout passes.
func runPerftest(ctx context.Context, cfg perftestConfig) (perftestResult, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	var lastErr error
	for try := 0; try < maxPortTries; try++ {
		port, err := freePort()
		if err != nil {
			return perftestResult{}, fmt.Errorf("ucx_perftest: %w", err)
		}
		res, err := runPerftestOnPort(ctx, cfg, port)
		if err == nil || !errors.Is(err, errServerGone) || ctx.Err() != nil {
			return res, err
		}
		lastErr = err
	}
	return perftestResult{}, lastErr
}

// errServerGone: the server exited before the client connected (most often: its port was
// taken); the measurement is retried on another port.
var errServerGone = errors.New("ucx_perftest server exited before the client connected")

func (cfg perftestConfig) args(port int) []string {
	args := []string{"-t", cfg.test, "-s", strconv.FormatInt(cfg.size, 10),
		"-n", strconv.Itoa(cfg.iters), "-w", strconv.Itoa(cfg.warmup), "-p", strconv.Itoa(port), "-f", "-v"}
	if cfg.memType != "" {
		args = append(args, "-m", cfg.memType)
	}
	return args
}

func (cfg perftestConfig) env() []string {
	env := os.Environ()
	if cfg.tls != "" {
		env = append(env, "UCX_TLS="+cfg.tls)
	}
	return env
}

// perftestServer is a running ucx_perftest server.
type perftestServer struct {
	child *proc.Child
	out   limitedBuffer
}

// startPerftestServer starts the server end on port, in its own process group, killed when
// ctx ends.
func startPerftestServer(ctx context.Context, cfg perftestConfig, port int) (*perftestServer, error) {
	s := &perftestServer{}
	cmd := exec.Command(cfg.binary, cfg.args(port)...)
	cmd.Env = cfg.env()
	var err error
	if s.child, err = proc.Start(ctx, cmd, proc.Options{Group: true, Stdout: &s.out, Stderr: &s.out}); err != nil {
		return nil, fmt.Errorf("start ucx_perftest server: %w", err)
	}
	return s, nil
}

// stop waits a moment for the server to exit by itself (it does once its client is done),
// then kills its group, and returns once it is reaped (bounded).
func (s *perftestServer) stop(grace time.Duration) {
	_ = s.child.Stop(grace, perftestReapBound)
}

// perftestReapBound is how long a killed ucx_perftest may take to be reaped.
const perftestReapBound = 10 * time.Second

// runGroup runs cmd to its end in a process group of its own, its output into out, and kills
// the group when ctx ends first; the wait for its reaping after the kill is bounded.
func runGroup(ctx context.Context, cmd *exec.Cmd, out io.Writer) error {
	c, err := proc.Start(ctx, cmd, proc.Options{Group: true, Stdout: out, Stderr: out})
	if err != nil {
		return err
	}
	select {
	case <-c.Exited():
	case <-ctx.Done(): // Start kills the group now
		if !c.Reap(perftestReapBound) {
			return fmt.Errorf("%w: ucx_perftest (pid %d) within %v", proc.ErrNotReaped, c.Pid(), perftestReapBound)
		}
	}
	return c.Err()
}

func runPerftestOnPort(ctx context.Context, cfg perftestConfig, port int) (perftestResult, error) {
	server, err := startPerftestServer(ctx, cfg, port)
	if err != nil {
		return perftestResult{}, err
	}
	defer server.stop(time.Second)
	return runPerftestClient(ctx, cfg, "127.0.0.1", port, server)
}

// runPerftestClient runs the client against host:port. The client connects when the server
// listens; until then connect() is refused and the client exits at once, so it is retried
// every 20ms, while the server lives (when it is ours) and within ctx.
func runPerftestClient(ctx context.Context, cfg perftestConfig, host string, port int, server *perftestServer) (perftestResult, error) {
	const retryEvery = 20 * time.Millisecond
	var serverDone <-chan struct{}
	if server != nil {
		serverDone = server.child.Exited()
	}
	for {
		client := exec.Command(cfg.binary, append([]string{host}, cfg.args(port)...)...)
		client.Env = cfg.env()
		var clientOut limitedBuffer
		err := runGroup(ctx, client, &clientOut)
		if err == nil {
			return parsePerftest(clientOut.String())
		}
		if ctx.Err() != nil {
			return perftestResult{}, fmt.Errorf("ucx_perftest (%s, %d bytes) did not finish in %v: %w", cfg.test, cfg.size, cfg.timeout, ctx.Err())
		}
		if !strings.Contains(clientOut.String(), "Connection refused") {
			return perftestResult{}, fmt.Errorf("ucx_perftest client failed: %v: %s", err, proc.LastLines(clientOut.String(), 3))
		}
		select {
		case <-serverDone:
			return perftestResult{}, fmt.Errorf("%w: %s", errServerGone, proc.LastLines(server.out.String(), 3))
		case <-time.After(retryEvery):
		case <-ctx.Done():
		}
	}
}

// freePort asks the kernel for a free TCP port on 127.0.0.1. Another process may take it
// before ucx_perftest binds it; runPerftest retries on a fresh port when that happens.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// parsePerftest reads the client's `-f -v` output: a CSV header line starting with
// "iterations," and the line of final figures after it. Bandwidth is in MiB/s
// (ucx_perftest's MB is 2^20 bytes).
func parsePerftest(out string) (perftestResult, error) {
	lines := strings.Split(out, "\n")
	for i, line := range lines {
		if !strings.HasPrefix(strings.TrimSpace(line), "iterations,") {
			continue
		}
		header := strings.Split(strings.TrimSpace(line), ",")
		for _, next := range lines[i+1:] {
			next = strings.TrimSpace(next)
			if next == "" {
				continue
			}
			values := strings.Split(next, ",")
			if len(values) != len(header) {
				break
			}
			field := map[string]string{}
			for k, h := range header {
				field[h] = strings.TrimSpace(values[k])
			}
			bw, err1 := strconv.ParseFloat(field["overall_bw"], 64)
			iters, err2 := strconv.Atoi(field["iterations"])
			lat, err3 := strconv.ParseFloat(field["avg_lat"], 64)
			if err := errors.Join(err1, err2, err3); err != nil {
				return perftestResult{}, fmt.Errorf("ucx_perftest output %q: %w", next, err)
			}
			if bw <= 0 {
				return perftestResult{}, fmt.Errorf("ucx_perftest reported a bandwidth of %v", bw)
			}
			return perftestResult{GBps: bw * (1 << 20) / 1e9, Iters: iters, AvgLatencyUs: lat}, nil
		}
		break
	}
	return perftestResult{}, fmt.Errorf("no final figures in ucx_perftest output: %s", proc.LastLines(out, 3))
}

// limitedBuffer keeps the first 64 KiB written to it: enough for any ucx_perftest report,
// bounded if a child floods its output. Safe for the concurrent writes of stdout and stderr.
type limitedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

const limitedBufferMax = 64 << 10

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := limitedBufferMax - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
