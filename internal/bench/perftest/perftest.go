// SPDX-License-Identifier: Apache-2.0

// Package perftest drives ucx_perftest, the limit kvxbench measures transfers against: a
// server and a client, each in its own process group (internal/peerproc/proc), their figures
// parsed from the client's -f -v report, every wait bounded by Config.Timeout.
package perftest

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

// Config is one ucx_perftest measurement between a server and a client.
type Config struct {
	// Binary is the ucx_perftest executable (found on PATH by Find).
	Binary string
	// Test is ucx_perftest's -t: tag_bw, the tagged send/receive kvxfer's wire uses.
	Test string
	// Size is the message size (-s), the same as the wire messages it is compared with.
	Size int64
	// TLS is UCX_TLS for both ends; empty leaves UCX's own choice (and the caller's
	// environment).
	TLS string
	// MemType is ucx_perftest's -m (memory type of both ends' buffers), such as "cuda" for
	// --memory device; empty leaves host memory.
	MemType string
	// Iters and Warmup are -n and -w.
	Iters, Warmup int
	// ErrorHandling creates the endpoints with peer error handling (-e), as kvxfer's are.
	ErrorHandling bool
	// Env is UCX settings (NAME=value) for both ends beyond UCX_TLS, such as the ones
	// kvxfer's contexts run with (native.Settings); they override the caller's environment.
	Env []string
	// Timeout bounds the whole measurement, retries included; both processes are killed
	// with their process groups when it passes.
	Timeout time.Duration
}

// Result is what ucx_perftest reported.
type Result struct {
	// GBps is the overall bandwidth in 10^9 bytes per second (ucx_perftest prints MiB/s).
	GBps float64
	// Iters is the iterations it reports having run.
	Iters int
	// AvgLatencyUs is its average time per message.
	AvgLatencyUs float64
	// TypicalLatencyUs is its median time per message (the 50.0_percentile_lat column); zero
	// where this ucx_perftest does not print it. For a ping-pong test (tag_lat, ucp_put_lat)
	// ucx_perftest reports one way, half a round trip.
	TypicalLatencyUs float64
}

// ErrNotFound means ucx_perftest is not installed: the baseline is skipped with a note, not
// an error, unless --baseline was asked for explicitly.
var ErrNotFound = errors.New("ucx_perftest not found on PATH (Debian package ucx-utils; `make deps` installs it)")

// Find returns the path of ucx_perftest, or ErrNotFound.
func Find() (string, error) {
	p, err := exec.LookPath("ucx_perftest")
	if err != nil {
		return "", ErrNotFound
	}
	return p, nil
}

// Iters picks -n so that one measurement moves about target bytes, at least 10
// messages and at most 100000, and -w a tenth of it.
func Iters(size, target int64) (iters, warmup int) {
	n := target / max(size, 1)
	iters = int(min(max(n, 10), 100000))
	warmup = min(max(iters/10, 2), 1000)
	return iters, warmup
}

// maxPortTries bounds how often a measurement is restarted on a fresh port when the server
// could not bind the one it was given (another process took it between our probe and its
// bind).
const maxPortTries = 3

// Run runs ucx_perftest's server and client on 127.0.0.1 and returns the client's
// final figures. It never leaves a process behind: each end runs in its own process group,
// killed when the measurement ends or its timeout passes.
func Run(ctx context.Context, cfg Config) (Result, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	var lastErr error
	for try := 0; try < maxPortTries; try++ {
		port, err := freePort()
		if err != nil {
			return Result{}, fmt.Errorf("ucx_perftest: %w", err)
		}
		res, err := runOnPort(ctx, cfg, port)
		if err == nil || !errors.Is(err, errServerGone) || ctx.Err() != nil {
			return res, err
		}
		lastErr = err
	}
	return Result{}, lastErr
}

// errServerGone: the server exited before the client connected (most often: its port was
// taken); the measurement is retried on another port.
var errServerGone = errors.New("ucx_perftest server exited before the client connected")

// Args is the command line of either end on port (the client's is preceded by the server's
// host).
func (cfg Config) Args(port int) []string {
	args := []string{"-t", cfg.Test, "-s", strconv.FormatInt(cfg.Size, 10),
		"-n", strconv.Itoa(cfg.Iters), "-w", strconv.Itoa(cfg.Warmup), "-p", strconv.Itoa(port), "-f", "-v"}
	if cfg.MemType != "" {
		args = append(args, "-m", cfg.MemType)
	}
	if cfg.ErrorHandling {
		args = append(args, "-e")
	}
	return args
}

func (cfg Config) env() []string {
	env := os.Environ()
	if cfg.TLS != "" {
		env = append(env, "UCX_TLS="+cfg.TLS)
	}
	return append(env, cfg.Env...)
}

// Server is a running ucx_perftest server (StartServer).
type Server struct {
	child *proc.Child
	out   limitedBuffer
}

// StartServer starts the server end on port, in its own process group, killed when
// ctx ends.
func StartServer(ctx context.Context, cfg Config, port int) (*Server, error) {
	s := &Server{}
	cmd := exec.Command(cfg.Binary, cfg.Args(port)...)
	cmd.Env = cfg.env()
	var err error
	if s.child, err = proc.Start(ctx, cmd, proc.Options{Group: true, Stdout: &s.out, Stderr: &s.out}); err != nil {
		return nil, fmt.Errorf("start ucx_perftest server: %w", err)
	}
	return s, nil
}

// Stop waits a moment for the server to exit by itself (it does once its client is done),
// then kills its group, and returns once it is reaped (bounded).
func (s *Server) Stop(grace time.Duration) {
	_ = s.child.Stop(grace, reapBound)
}

// reapBound is how long a killed ucx_perftest may take to be reaped.
const reapBound = 10 * time.Second

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
		if !c.Reap(reapBound) {
			return fmt.Errorf("%w: ucx_perftest (pid %d) within %v", proc.ErrNotReaped, c.Pid(), reapBound)
		}
	}
	return c.Err()
}

func runOnPort(ctx context.Context, cfg Config, port int) (Result, error) {
	server, err := StartServer(ctx, cfg, port)
	if err != nil {
		return Result{}, err
	}
	defer server.Stop(time.Second)
	return runClient(ctx, cfg, "127.0.0.1", port, server)
}

// RunClient runs the client against a server on host:port started by the other end, as a
// two-host run's baseline does, and returns its final figures; see runClient.
func RunClient(ctx context.Context, cfg Config, host string, port int) (Result, error) {
	return runClient(ctx, cfg, host, port, nil)
}

// runClient runs the client against host:port. The client connects when the server
// listens; until then connect() is refused and the client exits at once, so it is retried
// every 20ms, while the server lives (when it is ours) and within ctx.
func runClient(ctx context.Context, cfg Config, host string, port int, server *Server) (Result, error) {
	const retryEvery = 20 * time.Millisecond
	var serverDone <-chan struct{}
	if server != nil {
		serverDone = server.child.Exited()
	}
	for {
		client := exec.Command(cfg.Binary, append([]string{host}, cfg.Args(port)...)...)
		client.Env = cfg.env()
		var clientOut limitedBuffer
		err := runGroup(ctx, client, &clientOut)
		if err == nil {
			return parse(clientOut.String())
		}
		if ctx.Err() != nil {
			return Result{}, fmt.Errorf("ucx_perftest (%s, %d bytes) did not finish in %v: %w", cfg.Test, cfg.Size, cfg.Timeout, ctx.Err())
		}
		if !strings.Contains(clientOut.String(), "Connection refused") {
			return Result{}, fmt.Errorf("ucx_perftest client failed: %v: %s", err, proc.LastLines(clientOut.String(), 3))
		}
		select {
		case <-serverDone:
			return Result{}, fmt.Errorf("%w: %s", errServerGone, proc.LastLines(server.out.String(), 3))
		case <-time.After(retryEvery):
		case <-ctx.Done():
		}
	}
}

// freePort asks the kernel for a free TCP port on 127.0.0.1. Another process may take it
// before ucx_perftest binds it; Run retries on a fresh port when that happens.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// parse reads the client's `-f -v` output: a CSV header line starting with
// "iterations," and the line of final figures after it. Bandwidth is in MiB/s
// (ucx_perftest's MB is 2^20 bytes).
func parse(out string) (Result, error) {
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
				return Result{}, fmt.Errorf("ucx_perftest output %q: %w", next, err)
			}
			if bw <= 0 {
				return Result{}, fmt.Errorf("ucx_perftest reported a bandwidth of %v", bw)
			}
			res := Result{GBps: bw * (1 << 20) / 1e9, Iters: iters, AvgLatencyUs: lat}
			if v, ok := field["50.0_percentile_lat"]; ok {
				typical, err := strconv.ParseFloat(v, 64)
				if err != nil || typical < 0 {
					return Result{}, fmt.Errorf("ucx_perftest output %q: median latency %q", next, v)
				}
				res.TypicalLatencyUs = typical
			}
			return res, nil
		}
		break
	}
	return Result{}, fmt.Errorf("no final figures in ucx_perftest output: %s", proc.LastLines(out, 3))
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
