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
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/observe"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
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
	control   string
	tokens    int
	verbose   bool
	timeout   time.Duration
	freeze    time.Duration
	deadline  time.Duration
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("disagg", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.transport, "transport", "mem", `transport between the workers: "mem" (both roles in this process; UCX comes with the UCX transport)`)
	fs.StringVar(&o.control, "control", "127.0.0.1:0", "listen address of the prefill worker's HTTP control plane (also /healthz and /metrics)")
	fs.IntVar(&o.tokens, "tokens", 100, "prompt length of each request, in tokens")
	fs.BoolVar(&o.verbose, "v", false, "log every lifecycle event (debug) to stderr")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on the whole run")
	fs.DurationVar(&o.freeze, "freeze", 0, "if set, freeze the wire under a fourth request this long and show /healthz turning 503 and back")
	fs.DurationVar(&o.deadline, "progress-deadline", 2*time.Second, "engines' ProgressDeadline: no progress this long with work in flight is unhealthy")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case o.transport == "ucx":
		return o, errors.New("-transport=ucx: the UCX transport has not landed in kvxfer yet; use -transport=mem")
	case o.transport != "mem":
		return o, fmt.Errorf("-transport=%q: want mem", o.transport)
	case o.tokens <= 0 || int64(o.tokens) > poolDims.NumBlocks*poolDims.TokensPerBlock/3:
		return o, fmt.Errorf("-tokens=%d: want 1 to %d (three requests share a %d-block pool)", o.tokens,
			poolDims.NumBlocks*poolDims.TokensPerBlock/3, poolDims.NumBlocks)
	case o.timeout <= 0:
		return o, fmt.Errorf("-timeout=%v: must be positive", o.timeout)
	case o.deadline <= 0:
		return o, fmt.Errorf("-progress-deadline=%v: must be positive", o.deadline)
	case o.freeze < 0 || (o.freeze > 0 && o.freeze <= o.deadline):
		return o, fmt.Errorf("-freeze=%v: must exceed -progress-deadline=%v for the probe to notice", o.freeze, o.deadline)
	}
	return o, nil
}

// worker is one role's engine with its metrics.
type worker struct {
	eng     *transfer.Engine
	metrics *observe.Metrics
}

func newWorker(tr transfer.Transport, reg prometheus.Registerer, name string, o options, log *zap.Logger) (worker, error) {
	m, err := observe.NewMetrics(observe.MetricsConfig{Registerer: reg, ConstLabels: prometheus.Labels{"worker": name}})
	if err != nil {
		return worker{}, err
	}
	log = log.Named(name)
	eng, err := transfer.New(tr, transfer.Config{
		SlotBytes: 1 << 20, MaxConcurrent: 4, // small staging: a request streams through in chunks
		TransferTimeout: 10 * time.Second, QueueTimeout: 10 * time.Second, ProgressDeadline: o.deadline,
		Logger: log, Observer: observe.Multi(m, observe.NewLogObserver(log)),
	})
	if err != nil {
		return worker{}, err
	}
	if err := m.CollectHealth(eng); err != nil {
		_ = eng.Close()
		return worker{}, err
	}
	return worker{eng: eng, metrics: m}, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
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

	// Both workers' engines, over the in-memory network (both in this process).
	network := transfer.NewMemNetwork()
	const prefillAddr, decodeAddr = transfer.Peer("prefill-0"), transfer.Peer("decode-0")
	reg := prometheus.NewRegistry()
	pw, err := newWorker(network.Transport(prefillAddr), reg, "prefill", o, log)
	if err != nil {
		return err
	}
	dw, err := newWorker(network.Transport(decodeAddr), reg, "decode", o, log)
	if err != nil {
		_ = pw.eng.Close()
		return err
	}
	prefillPool, decodePool := newKVPool(), newKVPool()
	prefill := &prefillWorker{eng: pw.eng, addr: prefillAddr, pool: prefillPool, out: out, bound: 20 * time.Second,
		live: map[transfer.RequestID]*prefilled{}}
	defer func() { err = errors.Join(err, shutdown(prefill, pw, dw)) }()

	// The prefill worker's control plane, with its probes next to it.
	ln, err := net.Listen("tcp", o.control)
	if err != nil {
		return err
	}
	// In mem mode both engines live in this process: the probe answers for both.
	health := observe.CombineHealth(observe.NamedHealth{Name: "prefill", Source: pw.eng}, observe.NamedHealth{Name: "decode", Source: dw.eng})
	probes, err := observe.Handler(observe.HandlerConfig{Health: health, Gatherer: reg, Logger: log})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	prefill.routes(mux)
	mux.Handle(observe.HealthzPath, probes)
	mux.Handle(observe.MetricsPath, probes)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		err = errors.Join(err, srv.Shutdown(sctx))
	}()
	control := "http://" + ln.Addr().String()
	out.printf("control plane: %s (also %s and %s)", control, observe.HealthzPath, observe.MetricsPath)

	decode := &decodeWorker{eng: dw.eng, addr: decodeAddr, pool: decodePool, out: out, control: control,
		client: &http.Client{Timeout: 10 * time.Second}, bound: 20 * time.Second}

	// Request 1: prefilled, handed over, moved, verified.
	ho, err := decode.askPrefill(ctx, 1, o.tokens)
	if err != nil {
		return fmt.Errorf("request 1: %w", err)
	}
	out.printf("decode: request 1: handover from %s: %d tokens, prefill blocks %v", ho.Peer, ho.Tokens, ho.Blocks)
	if err := decode.receive(ctx, ho); err != nil {
		return fmt.Errorf("request 1: %w", err)
	}

	// Request 2: prefilled, but its client disconnects before decode pulls it.
	if _, err := decode.askPrefill(ctx, 2, o.tokens); err != nil {
		return fmt.Errorf("request 2: %w", err)
	}
	if err := decode.abort(ctx, 2); err != nil {
		return fmt.Errorf("request 2: %w", err)
	}

	// Request 3: decode starts pulling a request whose prefill never comes, and gives up.
	if err := decode.giveUp(ctx, 3, o.tokens, prefillAddr); err != nil {
		return fmt.Errorf("request 3: %w", err)
	}

	// Request 4 (with -freeze): the wire stops under a transfer; the probe must notice.
	if o.freeze > 0 {
		if err := freezeDemo(ctx, network, decode, o, control+observe.HealthzPath); err != nil {
			return fmt.Errorf("request 4: %w", err)
		}
	}

	if err := prefill.wait(ctx); err != nil {
		return err
	}
	code, reason := probe(ctx, control+observe.HealthzPath)
	out.printf("healthz: %d %s", code, reason)
	out.printf("metrics: prefill sent %.0f bytes, decode received %.0f bytes",
		testutil.ToFloat64(pw.metrics.SentBytes()), testutil.ToFloat64(dw.metrics.ReceivedBytes()))
	out.printf("KV blocks free: prefill %d of %d, decode %d of %d", prefillPool.freeBlocks(), poolDims.NumBlocks,
		decodePool.freeBlocks(), poolDims.NumBlocks)
	return nil
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

// shutdown drains and closes both engines, each bounded by its own timeouts.
func shutdown(prefill *prefillWorker, workers ...worker) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := []error{prefill.wait(ctx)}
	for _, w := range workers {
		errs = append(errs, w.eng.Drain(ctx), w.eng.Close())
	}
	return errors.Join(errs...)
}

// freezeDemo hangs every data chunk on the in-memory wire (as a frozen peer or a wedged NIC
// would), moves request 4 into it, and probes /healthz: 503 with the reason once nothing has
// moved for the progress deadline, 200 again once the wire moves and the transfer completes.
func freezeDemo(ctx context.Context, network *transfer.MemNetwork, decode *decodeWorker, o options, healthz string) error {
	network.SetFault(func(fp transfer.FaultPoint) transfer.Fault { return transfer.Fault{Hang: fp.Kind == transfer.KindData} })
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
	saw503 := false
	for time.Since(frozen) < o.freeze {
		if code, reason := probe(ctx, healthz); code == http.StatusServiceUnavailable && !saw503 {
			saw503 = true
			decode.out.printf("healthz while frozen: %d %s", code, reason)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-done:
			return fmt.Errorf("request 4 ended while the wire was frozen: %v", err)
		case <-tick.C:
		}
	}
	if !saw503 {
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
