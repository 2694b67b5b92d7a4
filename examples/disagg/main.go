// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/discovery"
	"github.com/kvxfer/kvxfer/transfer/observe"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return // -h: the usage is printed, nothing failed
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "disagg:", err)
		os.Exit(1)
	}
}

// printer serialises the two workers' lines.
type printer struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *printer) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format+"\n", args...)
}

// options are the command's flags.
type options struct {
	transport string
	role      string
	control   string
	tls       string
	tokens    int
	verbose   bool
	timeout   time.Duration
	freeze    time.Duration
	deadline  time.Duration
	discovery string
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("disagg", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `disagg: a prefill worker and a decode worker move one request's KV blocks, abort a
second and cancel a third in flight, handing ContextParams over HTTP on 127.0.0.1.

  disagg                       UCX: prefill here, decode in a second process (this binary)
  disagg -role=prefill -control=127.0.0.1:8400   and, in another terminal,
  disagg -role=decode -control=127.0.0.1:8400    the same two roles by hand
  disagg -transport=mem        both roles in this process, in-memory transport (-freeze only here)

`)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.transport, "transport", "ucx", `transport between the workers: "ucx" (two processes: this one is prefill and starts decode from this same binary) or "mem" (both roles in this process, in-memory transport)`)
	fs.StringVar(&o.role, "role", "both", `"both"; or, to run the two UCX processes by hand in two terminals, "prefill" in one and "decode" (with -control set to the prefill's address) in the other`)
	fs.StringVar(&o.control, "control", "127.0.0.1:0", "the prefill worker's HTTP control plane (also /healthz and /metrics): where prefill listens; with -role=decode, where to reach it")
	fs.StringVar(&o.tls, "tls", "posix,cma,self", `UCX_TLS for -transport=ucx: "posix,cma,self" (shared memory) or "tcp,self", say`)
	fs.IntVar(&o.tokens, "tokens", 100, "prompt length of each request, in tokens")
	fs.BoolVar(&o.verbose, "v", false, "log every lifecycle event (debug) to stderr")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on the whole run")
	fs.DurationVar(&o.freeze, "freeze", 0, "-transport=mem only: if set, freeze the wire under a fourth request this long and show /healthz turning 503 and back")
	fs.DurationVar(&o.deadline, "progress-deadline", 2*time.Second, "engines' ProgressDeadline: no progress this long with work in flight is unhealthy")
	fs.StringVar(&o.discovery, "discovery", "", "registry the workers find each other through: etcd://HOST:PORT/PREFIX; empty: the embedded one on the prefill worker's control plane")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	maxTokens := poolDims.NumBlocks * poolDims.TokensPerBlock / 3
	switch {
	case o.transport != "ucx" && o.transport != "mem":
		return o, fmt.Errorf("-transport=%q: want ucx or mem", o.transport)
	case o.transport == "ucx" && newUCXFabric == nil:
		return o, fmt.Errorf("-transport=ucx: %w", errNoUCX)
	case o.role != "both" && o.role != "prefill" && o.role != "decode":
		return o, fmt.Errorf("-role=%q: want both, prefill or decode", o.role)
	case o.role != "both" && o.transport != "ucx":
		return o, fmt.Errorf("-role=%s: one role per process needs -transport=ucx (mem runs both roles in one process)", o.role)
	case o.role == "decode" && o.discovery == "" && strings.HasSuffix(o.control, ":0"):
		return o, fmt.Errorf("-control=%s: with -role=decode, give the address the prefill process printed (host:port), or -discovery", o.control)
	case o.tokens <= 0 || int64(o.tokens) > maxTokens:
		return o, fmt.Errorf("-tokens=%d: want 1 to %d (three requests share a %d-block pool)", o.tokens, maxTokens, poolDims.NumBlocks)
	case o.timeout <= 0:
		return o, fmt.Errorf("-timeout=%v: must be positive", o.timeout)
	case o.deadline <= 0:
		return o, fmt.Errorf("-progress-deadline=%v: must be positive", o.deadline)
	case o.freeze != 0 && o.transport != "mem":
		return o, fmt.Errorf("-freeze=%v: only with -transport=mem (freezing the wire needs the in-memory transport's fault hooks)", o.freeze)
	case o.freeze < 0 || (o.freeze > 0 && o.freeze <= o.deadline):
		return o, fmt.Errorf("-freeze=%v: must exceed -progress-deadline=%v for the probe to notice", o.freeze, o.deadline)
	}
	return o, nil
}

// engineSlotBytes is both engines' staging slot: small, so a request streams through in
// several chunks.
const engineSlotBytes = 1 << 20

// worker is one role's engine with its metrics.
type worker struct {
	eng     *transfer.Engine
	metrics *observe.Metrics
}

// newWorker makes a role's engine over fab. The engine owns fab's transport from then on;
// if it cannot be made, the transport is closed here.
func newWorker(fab fabric, reg prometheus.Registerer, name string, o options, log *zap.Logger) (worker, error) {
	m, err := observe.NewMetrics(observe.MetricsConfig{Registerer: reg, ConstLabels: prometheus.Labels{"worker": name}})
	if err != nil {
		_ = fab.transport.Close(true)
		return worker{}, err
	}
	log = log.Named(name)
	eng, err := transfer.New(fab.transport, transfer.Config{
		SlotBytes: engineSlotBytes, MaxConcurrent: 4, StagingMemory: fab.staging,
		TransferTimeout: 10 * time.Second, QueueTimeout: 10 * time.Second, ProgressDeadline: o.deadline,
		Logger: log, Observer: observe.Multi(m, observe.NewLogObserver(log)),
	})
	if err != nil {
		_ = fab.transport.Close(true)
		return worker{}, err
	}
	if err := m.CollectHealth(eng); err != nil {
		_ = eng.Close()
		return worker{}, err
	}
	return worker{eng: eng, metrics: m}, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	log := zap.NewNop()
	if o.verbose {
		log = zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.Lock(zapcore.AddSync(stderr)), zapcore.DebugLevel))
	}
	out := &printer{w: stdout}
	switch {
	case o.transport == "mem":
		return runInProcess(ctx, o, out, log)
	case o.role == "decode":
		return runDecode(ctx, o, out, log)
	default:
		return runPrefill(ctx, o, out, stderr, log)
	}
}

// serveControl starts the prefill worker's control plane on addr, with the probes next to it.
// stop shuts it down, bounded.
func serveControl(addr string, prefill *prefillWorker, health observe.HealthSource, reg prometheus.Gatherer,
	log *zap.Logger, embedRegistry bool) (url string, stop func() error, err error) {
	probes, err := observe.Handler(observe.HandlerConfig{Health: health, Gatherer: reg, Logger: log})
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	mux := http.NewServeMux()
	prefill.routes(mux)
	for _, path := range []string{"/healthz", "/livez", "/readyz", "/metrics"} {
		mux.Handle(path, probes)
	}
	if embedRegistry { // the embedded default registry, when no -discovery is given
		workers := discovery.Handler()
		mux.Handle(discovery.WorkersPath, workers)
		mux.Handle(discovery.WorkersPath+"/", workers)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	stop = func() error {
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer scancel()
		if err := srv.Shutdown(sctx); err == nil {
			return nil
		}
		// A client connection that never sent a request (an HTTP client dials ahead, then
		// uses another idle one) counts as busy for 5s; close it rather than wait.
		return srv.Close()
	}
	return "http://" + ln.Addr().String(), stop, nil
}

func newPrefillWorker(eng *transfer.Engine, fab fabric, out *printer) (*prefillWorker, error) {
	pool, err := newKVPool(fab)
	if err != nil {
		return nil, err
	}
	return &prefillWorker{eng: eng, params: fab.params, pool: pool, out: out, bound: 20 * time.Second,
		decodeDone: make(chan struct{}), live: map[transfer.RequestID]*prefilled{}}, nil
}

func newDecodeWorker(eng *transfer.Engine, fab fabric, control string, reg discovery.Registry, out *printer) (*decodeWorker, error) {
	pool, err := newKVPool(fab)
	if err != nil {
		return nil, err
	}
	// Its own connections, so closing them when done touches no one else's.
	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), Timeout: 10 * time.Second}
	return &decodeWorker{eng: eng, addr: fab.self, senderPeer: fab.senderPeer, pool: pool, out: out,
		control: control, reg: reg, client: client, bound: 20 * time.Second}, nil
}

// meet opens the registry (-discovery, or the embedded one at control), publishes the
// workers given, and finds the prefill worker's control plane in it.
func meet(ctx context.Context, o options, control string, out *printer, workers ...func(discovery.Registry) error) (discovery.Registry, string, error) {
	target := o.discovery
	if target == "" {
		target = control
	}
	reg, err := openRegistry(target)
	if err != nil {
		return nil, "", err
	}
	for _, w := range workers {
		if err := w(reg); err != nil {
			_ = reg.Close()
			return nil, "", err
		}
	}
	found, err := findPrefill(ctx, reg)
	if err != nil {
		_ = reg.Close()
		return nil, "", err
	}
	out.printf("registry %s: %s's control plane is %s", target, prefillName, found)
	return reg, found, nil
}

// decodeStory is the decode worker's part, the same over every transport: request 1 moves,
// request 2 is aborted before it moves, request 3 is given up in flight.
func decodeStory(ctx context.Context, decode *decodeWorker, tokens int) error {
	// Request 1: prefilled, handed over, moved, verified.
	cp, err := decode.askPrefill(ctx, 1, tokens)
	if err != nil {
		return fmt.Errorf("request 1: %w", err)
	}
	if err := decode.receive(ctx, cp); err != nil {
		return fmt.Errorf("request 1: %w", err)
	}

	// Request 2: prefilled, but its client disconnects before decode pulls it.
	if _, err := decode.askPrefill(ctx, 2, tokens); err != nil {
		return fmt.Errorf("request 2: %w", err)
	}
	if err := decode.abort(ctx, 2); err != nil {
		return fmt.Errorf("request 2: %w", err)
	}

	// Request 3: decode starts pulling a request whose prefill never comes (from the engine
	// request 1 came from), and gives up.
	if err := decode.giveUp(ctx, 3, tokens, decode.senderPeer(cp)); err != nil {
		return fmt.Errorf("request 3: %w", err)
	}
	return nil
}

// runInProcess runs both roles in this process over the in-memory transport.
func runInProcess(ctx context.Context, o options, out *printer, log *zap.Logger) (err error) {
	network := mem.NewNetwork()
	reg := prometheus.NewRegistry()
	prefillFab := memFabric(network, "prefill-0")
	pw, err := newWorker(prefillFab, reg, "prefill", o, log)
	if err != nil {
		return err
	}
	decodeFab := memFabric(network, "decode-0") // made only now: newWorker closes it if it fails
	dw, err := newWorker(decodeFab, reg, "decode", o, log)
	if err != nil {
		_ = pw.eng.Close()
		return err
	}
	prefill, err := newPrefillWorker(pw.eng, prefillFab, out)
	if err != nil {
		return errors.Join(err, pw.eng.Close(), dw.eng.Close())
	}
	defer func() { err = errors.Join(err, shutdown(prefill, pw, dw)) }()

	// Both engines live in this process: the probe answers for both.
	health := observe.CombineHealth(observe.NamedHealth{Name: "prefill", Source: pw.eng}, observe.NamedHealth{Name: "decode", Source: dw.eng})
	control, stopControl, err := serveControl(o.control, prefill, health, reg, log, o.discovery == "")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stopControl()) }()
	out.printf("control plane: %s (also %s and %s)", control, "/healthz", "/metrics")
	registry, found, err := meet(ctx, o, control, out,
		func(r discovery.Registry) error { return publish(ctx, r, prefillName, "prefill", prefillFab, control) },
		func(r discovery.Registry) error { return publish(ctx, r, decodeName, "decode", decodeFab, "") })
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, registry.Close()) }()

	decode, err := newDecodeWorker(dw.eng, decodeFab, found, registry, out)
	if err != nil {
		return err
	}
	defer decode.client.CloseIdleConnections()
	if err := decodeStory(ctx, decode, o.tokens); err != nil {
		return err
	}
	// Request 4 (with -freeze): the wire stops under a transfer; the probe must notice.
	if o.freeze > 0 {
		if err := freezeDemo(ctx, network, decode, o, control+"/healthz"); err != nil {
			return fmt.Errorf("request 4: %w", err)
		}
	}

	if err := prefill.wait(ctx); err != nil {
		return err
	}
	code, reason := probe(ctx, control+"/healthz")
	out.printf("healthz: %d %s", code, reason)
	out.printf("metrics: prefill sent %.0f bytes, decode received %.0f bytes",
		testutil.ToFloat64(pw.metrics.SentBytes()), testutil.ToFloat64(dw.metrics.ReceivedBytes()))
	out.printf("KV blocks free: prefill %d of %d, decode %d of %d", prefill.pool.freeBlocks(), poolDims.NumBlocks,
		decode.pool.freeBlocks(), poolDims.NumBlocks)
	return nil
}

// ucxKeepalive is UCX's peer liveness period here: short, so a decode process that dies is
// noticed well within the run's bound.
const ucxKeepalive = 200 * time.Millisecond

// runPrefill is the prefill process over UCX: its engine, its pool and the control plane.
// With -role=both it starts the decode process itself and reports once that has exited;
// with -role=prefill it waits for a decode process started by hand to say it is done.
func runPrefill(ctx context.Context, o options, out *printer, stderr io.Writer, log *zap.Logger) (err error) {
	fab, err := newUCXFabric(o.tls, ucxKeepalive, log.Named("prefill.ucx"))
	if err != nil {
		return fmt.Errorf("prefill: UCX: %w", err)
	}
	reg := prometheus.NewRegistry()
	pw, err := newWorker(fab, reg, "prefill", o, log)
	if err != nil {
		return err
	}
	prefill, err := newPrefillWorker(pw.eng, fab, out)
	if err != nil {
		return errors.Join(err, pw.eng.Close())
	}
	defer func() { err = errors.Join(err, shutdown(prefill, pw)) }()
	control, stopControl, err := serveControl(o.control, prefill, pw.eng, reg, log, o.discovery == "")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stopControl()) }()
	out.printf("control plane: %s (also %s and %s)", control, "/healthz", "/metrics")
	registry, _, err := meet(ctx, o, control, out,
		func(r discovery.Registry) error { return publish(ctx, r, prefillName, "prefill", fab, control) })
	if err != nil {
		return err
	}
	// Withdrawn before the control plane stops (defers run last first).
	defer func() { err = errors.Join(err, registry.Close()) }()
	out.printf("prefill: pid %d, engine %s over UCX (%s)", os.Getpid(), fab.self.Short(), o.tls)

	if o.role == "both" {
		child, startErr := startDecodeProcess(o, strings.TrimPrefix(control, "http://"), out, stderr)
		if startErr != nil {
			return startErr
		}
		// Runs before the engine closes and the control plane stops (defers run last first).
		defer func() { err = errors.Join(err, child.stop()) }()
		out.printf("prefill: started the decode process, pid %d", child.pid())
		if waitErr := child.wait(ctx.Done()); waitErr != nil {
			return fmt.Errorf("decode process (pid %d): %w", child.pid(), waitErr)
		}
		out.printf("prefill: decode process (pid %d) exited: ok", child.pid())
		select {
		case <-prefill.decodeDone:
		default:
			return fmt.Errorf("decode process (pid %d) exited without saying it was done", child.pid())
		}
	} else {
		out.printf("prefill: waiting for a decode process: go run ./examples/disagg -role=decode -control=%s",
			strings.TrimPrefix(control, "http://"))
		select {
		case <-prefill.decodeDone:
		case <-ctx.Done():
			return fmt.Errorf("waiting for the decode process: %w", ctx.Err())
		}
	}

	if err := prefill.wait(ctx); err != nil {
		return err
	}
	code, reason := probe(ctx, control+"/healthz")
	out.printf("healthz: %d %s", code, reason)
	out.printf("metrics: prefill sent %.0f bytes", testutil.ToFloat64(pw.metrics.SentBytes()))
	out.printf("KV blocks free: prefill %d of %d", prefill.pool.freeBlocks(), poolDims.NumBlocks)
	return nil
}

// runDecode is the decode process over UCX: its engine and pool, talking to the prefill
// process only through the control plane at -control and the engines.
func runDecode(ctx context.Context, o options, out *printer, log *zap.Logger) (err error) {
	fab, err := newUCXFabric(o.tls, ucxKeepalive, log.Named("decode.ucx"))
	if err != nil {
		return fmt.Errorf("decode: UCX: %w", err)
	}
	reg := prometheus.NewRegistry()
	dw, err := newWorker(fab, reg, "decode", o, log)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, shutdown(nil, dw)) }()
	registry, control, err := meet(ctx, o, "http://"+o.control, out,
		func(r discovery.Registry) error { return publish(ctx, r, decodeName, "decode", fab, "") })
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, registry.Close()) }()
	decode, err := newDecodeWorker(dw.eng, fab, control, registry, out)
	if err != nil {
		return err
	}
	defer decode.client.CloseIdleConnections() // the prefill process may serve on after we exit
	out.printf("decode: pid %d, engine %s over UCX (%s), prefill's control plane %s", os.Getpid(), fab.self.Short(), o.tls, decode.control)
	if err := decodeStory(ctx, decode, o.tokens); err != nil {
		return err
	}
	h := dw.eng.Health()
	if h.Healthy {
		out.printf("decode: health: ok")
	} else {
		out.printf("decode: health: %s", h.Reason)
	}
	out.printf("metrics: decode received %.0f bytes", testutil.ToFloat64(dw.metrics.ReceivedBytes()))
	out.printf("KV blocks free: decode %d of %d", decode.pool.freeBlocks(), poolDims.NumBlocks)
	// Withdrawn before saying done: the registry may be the prefill process's control plane,
	// which stops once it hears done (the deferred Close is then a no-op).
	if err := registry.Close(); err != nil {
		return err
	}
	return decode.done(ctx)
}

// probe GETs url and returns the status code and first line of the body.
func probe(ctx context.Context, url string) (int, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	line, _, _ := bytes.Cut(body, []byte("\n"))
	return resp.StatusCode, string(line)
}

// shutdown drains and closes the engines, each bounded by its own timeouts, after waiting
// (bounded) for the prefill worker's cleanups if there is one.
func shutdown(prefill *prefillWorker, workers ...worker) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	if prefill != nil {
		errs = append(errs, prefill.wait(ctx))
	}
	for _, w := range workers {
		errs = append(errs, w.eng.Drain(ctx), w.eng.Close())
	}
	return errors.Join(errs...)
}

// freezeDemo hangs every data chunk on the in-memory wire (as a frozen peer or a wedged NIC
// would), moves request 4 into it, and probes /healthz: 503 with the reason once nothing has
// moved for the progress deadline, 200 again once the wire moves and the transfer completes.
func freezeDemo(ctx context.Context, network *mem.Network, decode *decodeWorker, o options, healthz string) error {
	network.SetFault(func(fp mem.FaultPoint) mem.Fault { return mem.Fault{Hang: fp.Kind == transport.KindData} })
	ho, err := decode.askPrefill(ctx, 4, o.tokens)
	if err != nil {
		return err
	}
	decode.out.printf("wire frozen under request 4 for %v (progress deadline %v)", o.freeze, o.deadline)
	done := make(chan error, 1)
	go func() { done <- decode.receive(ctx, ho) }()

	frozen := time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	// The two roles notice the stall at their own moments (each from its own last progress),
	// so the probe keeps asking for the whole freeze and reports the answer that names the
	// most stalled workers, not whichever 503 came first.
	saw503, worst := false, ""
	for time.Since(frozen) < o.freeze {
		if code, reason := probe(ctx, healthz); code == http.StatusServiceUnavailable {
			if !saw503 || strings.Count(reason, ";") > strings.Count(worst, ";") {
				worst = reason
			}
			saw503 = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-done:
			return fmt.Errorf("request 4 ended while the wire was frozen: %v", err)
		case <-tick.C:
		}
	}
	if saw503 {
		decode.out.printf("healthz while frozen: %d %s", http.StatusServiceUnavailable, worst)
	} else {
		decode.out.printf("healthz while frozen: never 503")
	}
	network.SetFault(nil)
	network.Resume()
	decode.out.printf("wire moving again")
	select {
	case err := <-done:
		if err != nil {
			return err
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	code, reason := probe(ctx, healthz)
	decode.out.printf("healthz after the wire moved again: %d %s", code, reason)
	return nil
}
