// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvxfer/kvxfer/internal/bench/perftest"
	"github.com/kvxfer/kvxfer/internal/hopstamp"
	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/internal/transferdefaults"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
)

// The scenario protocol, over the control connection, driven by the decode end:
//
//	decode -> prefill  scenario{tokens}        prefill plans the request, checksums its stream
//	prefill -> decode  ready{checksum, bytes}
//	decode -> prefill  req{id} (one per request; decode has posted its Receive)
//	decode -> prefill  report (after the round's clock stopped)
//	prefill -> decode  sent{sends: [{id, gather_ns, err}, ...]} once every Send asked ended
//
// With --sender first or expose, each round's requests go before any Receive (req{id,
// sender}), the prefill end answers posted{id, params} once its Send or Expose is posted, and
// the round's clock starts after every answer; report and sent follow as above. Nothing
// crosses the control connection while the clock runs.
//	decode -> prefill  bye
//
// Requests run in rounds of --concurrency at once. The clock runs from the first Receive of a
// round to the last Done; the checks of every byte, and the scrub of the destination blocks
// that makes a transfer that wrote nothing fail its check, run between rounds, off the clock.

// prefillEnd is one prefill rank's state: its pool, filled with a pattern in which every
// 8-byte word differs, and the plans of the current scenario: one per decode rank (each that
// rank's share of the heads, --decode-tp), else one.
type prefillEnd struct {
	cfg   RunConfig
	rank  int
	pool  []byte
	eng   engineSide
	peer  peerRef
	plans []*layout.Plan
	rng   *rand.Rand
}

func newPrefillEnd(cfg RunConfig, rank int, eng engineSide, peer peerRef) (*prefillEnd, error) {
	pool, _, err := eng.NewPool(cfg.Prefill.SpanBytes())
	if err != nil {
		return nil, fmt.Errorf("prefill rank %d: KV pool: %w", rank, err)
	}
	fillPattern(pool, cfg.Seed*1000+uint64(rank)+1)
	if err := pushPool(eng, pool); err != nil { // device pools: the pattern goes to the GPU
		return nil, fmt.Errorf("prefill rank %d: KV pool: %w", rank, err)
	}
	return &prefillEnd{cfg: cfg, rank: rank, pool: pool, eng: eng, peer: peer,
		rng: rand.New(rand.NewPCG(cfg.Seed, uint64(rank)))}, nil
}

// serve answers the decode end until bye, an error, or ctx's end. The perftest server's
// goroutine is waited for, bounded by ctx, before it returns, and every posted request's
// handle released.
func (p *prefillEnd) serve(ctx context.Context, c *control) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()         // ends the perftest server's wait on every exit
	var asked []postedSend // the requests asked since the last report, in the order asked
	defer func() {
		for _, a := range asked {
			a.release()
		}
	}()
	for {
		if ctx.Err() != nil {
			return fmt.Errorf("prefill rank %d stopped: %w", p.rank, ctx.Err())
		}
		m, err := c.recvMessage(time.Second)
		switch {
		case isIdle(err):
			continue // nothing yet; check ctx and wait again
		case err != nil:
			return err
		case m.Bye:
			return nil
		case m.Scenario != nil:
			ready, err := p.plan1(m.Scenario.Tokens, m.Scenario.Layers)
			if err != nil {
				c.sendError(err)
				return err
			}
			if err := c.send(message{Ready: &ready}); err != nil {
				return err
			}
		case m.PerftestServe != nil:
			port, err := p.startPerftest(ctx, *m.PerftestServe, &wg)
			if err != nil {
				c.sendError(err)
				return err
			}
			if err := c.send(message{PerftestPort: port}); err != nil {
				return err
			}
		case m.Req != nil:
			if p.plans == nil {
				err := errors.New("request before any scenario")
				c.sendError(err)
				return err
			}
			// Send and Expose return at once: the request runs in the engine while this loop
			// reads on, and its outcome waits for the round's report.
			a, pm := p.post(ctx, *m.Req)
			asked = append(asked, a)
			if pm != nil {
				if err := c.send(message{Posted: pm}); err != nil {
					return err
				}
			}
		case m.Report:
			sent := p.report(ctx, asked)
			asked = asked[:0]
			if err := c.send(message{Sent: sent}); err != nil {
				return err
			}
		}
	}
}

// startPerftest starts a ucx_perftest server for the decode host's baseline, on a free port
// of every interface, and reaps it (killing it at its timeout) on a goroutine of wg.
func (p *prefillEnd) startPerftest(ctx context.Context, m perftestMsg, wg *sync.WaitGroup) (int, error) {
	bin, err := perftest.Find()
	if err != nil {
		return 0, fmt.Errorf("prefill host: %w; run connect with --baseline=false", err)
	}
	if m.Timeout <= 0 || m.Size <= 0 {
		return 0, fmt.Errorf("perftest request with timeout %v and size %d", m.Timeout, m.Size)
	}
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		return 0, fmt.Errorf("prefill host: find a port for ucx_perftest: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cfg := perftest.Config{Binary: bin, Test: m.Test, Size: m.Size, TLS: m.TLS, Iters: m.Iters, Warmup: m.Warmup,
		Timeout: m.Timeout, ErrorHandling: m.ErrorHandling, Env: m.Env}
	sctx, cancel := context.WithTimeout(ctx, m.Timeout)
	server, err := perftest.StartServer(sctx, cfg, port)
	if err != nil {
		cancel()
		return 0, fmt.Errorf("prefill host: %w", err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer cancel()
		server.Stop(m.Timeout)
	}()
	return port, nil
}

// plan1 picks the blocks of the scenario's request in random order over the pool and
// checksums its stream, which does not change for the scenario's life (sends only read it).
// layers > 0 sends only the first layers of each block.
func (p *prefillEnd) plan1(tokens, layers int64) (readyMsg, error) {
	n := (tokens + p.cfg.Prefill.TokensPerBlock - 1) / p.cfg.Prefill.TokensPerBlock
	if n > p.cfg.Prefill.NumBlocks {
		return readyMsg{}, fmt.Errorf("prefill rank %d: %d tokens need %d blocks, the pool has %d", p.rank, tokens, n, p.cfg.Prefill.NumBlocks)
	}
	sel, err := firstLayers(p.cfg.Prefill.All(), layers)
	if err != nil {
		return readyMsg{}, fmt.Errorf("prefill rank %d: %w", p.rank, err)
	}
	blocks := randomBlocks(p.rng, p.cfg.Prefill.NumBlocks, n)
	var ready readyMsg
	p.plans = nil
	for k := range p.cfg.decodeRanks() {
		share, err := senderSelection(p.cfg.Prefill, hello{Rank: p.rank, TP: p.cfg.PrefillTP}, hello{Rank: k, TP: p.cfg.decodeRanks()})
		if err != nil {
			return readyMsg{}, fmt.Errorf("prefill rank %d: %w", p.rank, err)
		}
		share.LayerBegin, share.LayerEnd = sel.LayerBegin, sel.LayerEnd
		plan, err := layout.NewPlan(p.cfg.Prefill, share, blocks)
		if err != nil {
			return readyMsg{}, fmt.Errorf("prefill rank %d: %w", p.rank, err)
		}
		p.plans = append(p.plans, plan)
		var sum uint32
		if p.cfg.Verify {
			sum = streamChecksum(plan, p.pool)
		}
		if k == 0 {
			ready.Checksum = sum
		}
		if p.cfg.decodeRanks() > 1 {
			ready.RankChecksums = append(ready.RankChecksums, sum)
		}
		ready.Bytes += plan.Bytes()
	}
	return ready, nil
}

// post posts one request's sending side as r.Sender says (an Expose for expose, else a Send
// to the decode end) and returns it, with the posted message to answer for first and expose
// (nil for after). It does not wait for the Send to end: report does.
func (p *prefillEnd) post(ctx context.Context, r reqMsg) (postedSend, *postedMsg) {
	a := postedSend{id: r.ID, m: &timedMover{pool: p.pool}}
	pm := &postedMsg{ID: r.ID}
	var plan *layout.Plan
	if r.DecodeRank >= 0 && r.DecodeRank < len(p.plans) {
		plan = p.plans[r.DecodeRank]
	}
	switch {
	case plan == nil:
		a.err = fmt.Errorf("prefill rank %d: request %d for decode rank %d of %d", p.rank, r.ID, r.DecodeRank, len(p.plans))
	case r.Sender == SenderExpose:
		x, ok := p.eng.(exposer)
		if !ok {
			a.err = fmt.Errorf("prefill rank %d: this engine cannot expose a request", p.rank)
		} else {
			a.h, pm.Params, pm.Secret, a.err = x.Expose(ctx, r.ID, plan, a.m)
		}
	default:
		a.h, a.err = p.eng.Send(ctx, r.ID, r.Secret, p.peer, plan, a.m)
	}
	if a.err != nil {
		a.h = nil
		pm.Err = a.err.Error()
	}
	if r.Sender != SenderFirst && r.Sender != SenderExpose {
		pm = nil
	}
	return a, pm
}

// decodeEnd is the decode end: it drives the scenarios and measures them.
type decodeEnd struct {
	cfg  RunConfig
	pool []byte // decode rank 0's pool: pools[0]
	// pools are the decode ranks' pools, one per rank (--decode-tp); one without.
	pools [][]byte
	// direct: the decode pool may go direct, so transfers take the one-copy path (a prefill
	// pool that cannot fails them as incompatible: the path reported is the one taken).
	direct bool
	eng    engineSide
	peers  []peerRef  // one per prefill rank
	ctrls  []*control // one per prefill rank
	// remoteHost is the prefill host of a two-host run (connect), where the baseline's
	// server runs; empty for run, whose baseline runs both ends here.
	remoteHost string
	// paths are the paths the engine said the timed requests took (Handle.Path).
	paths map[string]bool
	// flow is the --sender flow of the scenario being measured (scenario.flow).
	flow   string
	rng    *rand.Rand
	nextID uint64
	// hopRows, where not nil (run --hops), gets each timed row's request ids, and hopIDs
	// collects the row being measured (round).
	hopRows *[]hopRow
	hopIDs  map[uint64]bool
}

// scenario is one row of the table: a prompt length at a concurrency.
type scenario struct {
	tokens      int64
	concurrency int
	// latency marks a latency row (latencyScenarios), measured beside its latencyLimit.
	latency bool
	// layers > 0 moves only the first layers of each block, as a one-layer chunk of a
	// streamed or partial request; 0 moves every layer.
	layers int64
}

func (s scenario) name(cfg RunConfig) string {
	n := fmt.Sprintf("transfer %s %s c=%d", cfg.ShapeName, humanTokens(s.tokens), s.concurrency)
	if s.latency {
		size := humanTokens(s.tokens)
		if s.layers > 0 {
			size = fmt.Sprintf("%d block, %d layer", blocksFor(Shape{Dims: cfg.Decode.Dims()}, s.tokens), s.layers)
		}
		n = fmt.Sprintf("latency %s %s c=%d", cfg.ShapeName, size, s.concurrency)
	}
	if cfg.PrefillTP > 1 {
		n += fmt.Sprintf(" tp%d>1", cfg.PrefillTP)
	}
	if cfg.decodeRanks() > 1 {
		n += fmt.Sprintf(" tp1>%d", cfg.decodeRanks())
	}
	if f := s.flow(cfg, true); f != SenderAfter {
		n += " " + f
	}
	if cfg.Memory == "device" {
		n += " device"
	}
	return n
}

// flow is the --sender flow the scenario runs: SenderAuto resolved (expose for a latency row
// where it applies: one prefill rank, host memory, and canExpose, the decode engine's
// exposer), "" as SenderAfter.
func (s scenario) flow(cfg RunConfig, canExpose bool) string {
	switch cfg.Sender {
	case "", SenderAuto:
		if cfg.Sender == SenderAuto && s.latency && cfg.PrefillTP == 1 && cfg.Memory != "device" && canExpose {
			return SenderExpose
		}
		return SenderAfter
	}
	return cfg.Sender
}

// measure runs one scenario and returns its result, baseline not yet set.
func (d *decodeEnd) measure(ctx context.Context, s scenario, o Output, bar *progress) (Result, error) {
	_, canExpose := d.eng.(exposer)
	d.flow = s.flow(d.cfg, canExpose)
	res := Result{Op: "transfer", Model: d.cfg.ShapeName, Tokens: s.tokens, Concurrency: s.concurrency,
		Name: s.name(d.cfg), TLS: d.cfg.TLS, PrefillTP: d.cfg.PrefillTP, Layers: s.layers,
		ClusterKey: len(d.cfg.ClusterKey) > 0}
	if !canExpose && d.flow == SenderAfter && s.flow(d.cfg, true) == SenderExpose {
		res.Name = strings.TrimSuffix(res.Name, " "+SenderExpose) // auto fell back: this engine cannot expose
	}
	if d.flow != SenderAfter {
		res.Sender = d.flow
	}
	if s.latency {
		res.Op = "latency"
	}
	if d.cfg.decodeRanks() > 1 {
		res.DecodeTP = d.cfg.decodeRanks()
	}
	// Each prefill rank plans the request and tells its checksum: sums[prefill rank][decode
	// rank], one decode rank unless --decode-tp.
	sums := make([][]uint32, len(d.ctrls))
	for _, c := range d.ctrls {
		if err := c.send(message{Scenario: &scenarioMsg{Tokens: s.tokens, Layers: s.layers}}); err != nil {
			return res, err
		}
	}
	for r, c := range d.ctrls {
		m, err := c.recvMessage(0)
		if err != nil {
			return res, fmt.Errorf("prefill rank %d: %w", r, err)
		}
		if m.Ready == nil {
			return res, fmt.Errorf("%w: prefill rank %d answered a scenario with something else than ready", errPeerNotKvxbench, r)
		}
		sums[r] = []uint32{m.Ready.Checksum}
		if ranks := d.cfg.decodeRanks(); ranks > 1 {
			if len(m.Ready.RankChecksums) != ranks {
				return res, fmt.Errorf("%w: prefill rank %d sent %d checksums for %d decode ranks", errPeerNotKvxbench, r, len(m.Ready.RankChecksums), ranks)
			}
			sums[r] = m.Ready.RankChecksums
		}
		res.Bytes += m.Ready.Bytes
	}
	// Concurrency disjoint sets of destination blocks, each in random order.
	nBlocks := blocksFor(Shape{Dims: d.cfg.Decode.Dims()}, s.tokens)
	if need := nBlocks * int64(s.concurrency); need > d.cfg.Decode.NumBlocks {
		return res, fmt.Errorf("decode pool has %d blocks, the scenario needs %d", d.cfg.Decode.NumBlocks, need)
	}
	perm := d.rng.Perm(int(d.cfg.Decode.NumBlocks))
	plans := make([][]recvSub, s.concurrency)
	for i := range plans {
		ids := make([]int32, nBlocks)
		for k := range ids {
			ids[k] = int32(perm[int64(i)*nBlocks+int64(k)])
		}
		for r := range d.ctrls {
			for k := range d.cfg.decodeRanks() {
				sel, err := receiverSelection(d.cfg.Decode, hello{Rank: r, TP: d.cfg.PrefillTP}, hello{Rank: k, TP: d.cfg.decodeRanks()})
				if err != nil {
					return res, err
				}
				if sel, err = firstLayers(sel, s.layers); err != nil {
					return res, fmt.Errorf("decode plan: %w", err)
				}
				p, err := layout.NewPlan(d.cfg.Decode, sel, ids)
				if err != nil {
					return res, fmt.Errorf("decode plan: %w", err)
				}
				plans[i] = append(plans[i], recvSub{peer: d.peers[r], plan: p, prefillRank: r, decodeRank: k})
			}
		}
	}
	sends := int64(len(d.ctrls) * d.cfg.decodeRanks()) // Sends per request: one per pair of ranks
	res.MessageBytes = min(d.cfg.SlotBytes, res.Bytes/sends)
	res.Path = "staging"
	if d.cfg.Memory == "device" {
		res.Path = "device staging"
	}
	if d.direct {
		chunk := d.cfg.DirectChunkBytes
		if chunk == 0 {
			chunk = transferdefaults.DirectChunkBytes
		}
		res.MessageBytes = min(chunk, res.Bytes/sends)
		res.Path = "direct"
	}

	// One untimed warm-up round first, as ucx_perftest warms up before its baseline: the
	// first touch of each pool page and UCX's first use of each region (registration caches,
	// protocol selection) are set-up costs, not transfer bandwidth. It is verified all the same.
	if err := d.warmUp(ctx, plans, sums, res.Name); err != nil {
		return res, err
	}
	d.paths = nil // the warm-up's do not count
	if d.hopRows != nil {
		d.hopIDs = map[uint64]bool{}
		defer func() { *d.hopRows, d.hopIDs = append(*d.hopRows, hopRow{res.Name, d.hopIDs}), nil }()
	}
	var lat latencies
	var wall time.Duration
	var gatherNs, scatterNs int64
	verified := d.cfg.Verify
	// --duration bounds the scenario's time on the clock, checks included: scrubbing and
	// checksumming every round's bytes costs about as much as moving them over the RMA path, and
	// counting only the transfers made a default run take over a minute.
	began := time.Now()
	for round := 0; len(lat) < o.MaxIters && (len(lat) < minIters || time.Since(began) < o.Duration); round++ {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("%s: stopped after %d requests: %w", res.Name, len(lat), err)
		}
		if d.cfg.Verify {
			_ = eachParallel(len(plans), func(i int) error {
				for _, sub := range plans[i] {
					scrub(sub.plan, d.pools[sub.decodeRank])
				}
				return nil
			})
			if err := scrubPlans(d.eng, plans, d.pool); err != nil { // device pools: the scrub goes to the GPU
				return res, fmt.Errorf("%s: %w", res.Name, err)
			}
		}
		rl, rw, g, sc, err := d.round(ctx, plans)
		if err != nil {
			return res, fmt.Errorf("%s: %w", res.Name, err)
		}
		lat, wall, gatherNs, scatterNs = append(lat, rl...), wall+rw, gatherNs+g, scatterNs+sc
		if d.cfg.Verify {
			if err := pullPlans(d.eng, plans, d.pool); err != nil { // device pools: check what landed on the GPU
				return res, fmt.Errorf("%s: %w", res.Name, err)
			}
			err := eachParallel(len(plans), func(i int) error {
				for _, sub := range plans[i] {
					if got, want := streamChecksum(sub.plan, d.pools[sub.decodeRank]), sums[sub.prefillRank][sub.decodeRank]; got != want {
						return fmt.Errorf("%s: verification failed: request %d of round %d from prefill rank %d to decode rank %d landed with checksum %08x, the sender's stream has %08x",
							res.Name, i, round, sub.prefillRank, sub.decodeRank, got, want)
					}
				}
				return nil
			})
			if err != nil {
				return res, err
			}
		}
		bar.tick()
	}
	n := int64(len(lat))
	res.Requests = len(lat)
	res.GBps = gbps(res.Bytes*n, wall)
	res.P50us, res.P99us = us(lat.percentile(50)), us(lat.percentile(99))
	res.GatherUs = float64(gatherNs) / float64(n) / 1e3
	res.ScatterUs = float64(scatterNs) / float64(n) / 1e3
	res.WireUs = max(us(lat.mean())-res.GatherUs/float64(len(d.ctrls))-res.ScatterUs/float64(d.cfg.decodeRanks()), 0)
	res.Verified = verified
	if len(d.paths) > 0 { // what the engine says overrides what the pools allowed
		res.Path = strings.Join(slices.Sorted(maps.Keys(d.paths)), "+")
		if d.cfg.Memory == "device" {
			res.Path = "device " + res.Path
		}
	}
	return res, nil
}

// recvOp is one Receive of a round: its request to the prefill ends it names, its subs, and
// the request of the round it is part of (with --decode-tp, one per decode rank).
type recvOp struct {
	req  reqMsg
	subs []recvSub
	of   int
}

// receives splits a round's requests into Receives: one per request, or with several decode
// ranks one per request and rank, each with its own id and its rank's pool.
func (d *decodeEnd) receives(plans [][]recvSub) []recvOp {
	var ops []recvOp
	for i, subs := range plans {
		groups := [][]recvSub{subs}
		if d.cfg.decodeRanks() > 1 {
			groups = groups[:0]
			for _, sub := range subs {
				groups = append(groups, []recvSub{sub})
			}
		}
		for _, g := range groups {
			d.nextID++
			op := recvOp{req: reqMsg{ID: d.nextID, DecodeRank: g[0].decodeRank}, subs: g, of: i}
			if len(d.cfg.ClusterKey) > 0 {
				// As a serving stack would: the secret travels to the Send in the request's
				// ContextParams (here the control connection), never on the engines' wire.
				op.req.Secret = transfer.NewClaimSecret()
			}
			ops = append(ops, op)
		}
	}
	return ops
}

// round runs one request per plan set at once and returns their latencies (a request's from
// its first Receive to its last Done), the round's wall time, and the time spent gathering
// (prefill) and scattering (decode).
func (d *decodeEnd) round(ctx context.Context, plans [][]recvSub) (latencies, time.Duration, int64, int64, error) {
	type posted struct {
		id    uint64
		of    int
		h     pendingXfer
		m     *timedMover
		start time.Time
	}
	var ps []posted
	defer func() {
		for _, p := range ps {
			p.h.Release()
		}
	}()
	ops := d.receives(plans)
	// first and expose: every prefill end posts its side before the round's clock starts.
	sendersFirst := d.flow == SenderFirst || d.flow == SenderExpose
	var exposed map[uint64]postedMsg
	if sendersFirst {
		var err error
		if exposed, err = d.postSendersFirst(ops); err != nil {
			return nil, 0, 0, 0, err
		}
	}
	asked := make([][]uint64, len(d.ctrls)) // the requests asked of each prefill rank, reported after the round
	start := time.Now()
	for _, op := range ops {
		id := op.req.ID
		m := &timedMover{pool: d.pools[op.subs[0].decodeRank]}
		t := time.Now()
		if d.hopIDs != nil {
			d.hopIDs[id] = true
			hopstamp.Mark(id, "bench Receive called")
		}
		var h pendingXfer
		var err error
		if d.flow == SenderExpose {
			h, err = d.receiveExposed(ctx, exposed[id], op.subs, m)
		} else {
			h, err = d.eng.Receive(ctx, id, op.req.Secret, op.subs, m)
		}
		if err != nil {
			return nil, 0, 0, 0, fmt.Errorf("receive %d: %w", id, err)
		}
		ps = append(ps, posted{id: id, of: op.of, h: h, m: m, start: t})
		for _, sub := range op.subs {
			asked[sub.prefillRank] = append(asked[sub.prefillRank], id)
			if sendersFirst {
				continue
			}
			if err := d.ctrls[sub.prefillRank].send(message{Req: &op.req}); err != nil {
				return nil, 0, 0, 0, fmt.Errorf("prefill rank %d: %w", sub.prefillRank, err)
			}
		}
	}
	// One waiter per Receive notes the moment its Done closes, so a request that ends
	// before an earlier one is not charged for the wait.
	ends := make([]time.Time, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-p.h.Done():
				ends[i] = time.Now()
				hopstamp.Mark(p.id, "bench waiter awake")
			case <-ctx.Done():
			}
		}()
	}
	wg.Wait()
	first, last := make([]time.Time, len(plans)), make([]time.Time, len(plans))
	var lastEnd time.Time
	for i, p := range ps {
		if ends[i].IsZero() {
			return nil, 0, 0, 0, fmt.Errorf("request %d: %w", p.id, ctx.Err())
		}
		if err := p.h.Err(); err != nil {
			return nil, 0, 0, 0, fmt.Errorf("request %d: %w", p.id, err)
		}
		if first[p.of].IsZero() {
			first[p.of] = p.start
		}
		if ends[i].After(last[p.of]) {
			last[p.of] = ends[i]
		}
		if path := p.h.Path(); path != "" {
			if d.paths == nil {
				d.paths = map[string]bool{}
			}
			d.paths[path] = true
		}
		if ends[i].After(lastEnd) {
			lastEnd = ends[i]
		}
	}
	lat := make(latencies, len(plans))
	for i := range lat {
		lat[i] = last[i].Sub(first[i])
	}
	// The pool's blocks are read (checks) and zeroed (scrub) next: only once the engine and
	// the transport are done with them.
	for _, p := range ps {
		select {
		case <-p.h.Quiesced():
		case <-ctx.Done():
			return nil, 0, 0, 0, fmt.Errorf("request %d not quiesced: %w", p.id, ctx.Err())
		}
	}
	wall := lastEnd.Sub(start)
	var scatterNs int64
	for _, p := range ps {
		scatterNs += p.m.scatterNs.Load()
	}
	// The clock has stopped: ask each prefill end how its Sends ended, bounded by the control
	// timeout. Asking only now keeps the reports' messages out of the measured window.
	var gatherNs int64
	for r, c := range d.ctrls {
		if len(asked[r]) == 0 {
			continue
		}
		if err := c.send(message{Report: true}); err != nil {
			return nil, 0, 0, 0, fmt.Errorf("prefill rank %d: %w", r, err)
		}
		m, err := c.recvMessage(0)
		if err != nil {
			return nil, 0, 0, 0, fmt.Errorf("prefill rank %d: %w", r, err)
		}
		if m.Sent == nil {
			return nil, 0, 0, 0, fmt.Errorf("%w: prefill rank %d sent something else than a send report", errPeerNotKvxbench, r)
		}
		g, err := checkSent(r, asked[r], m.Sent.Sends)
		if err != nil {
			return nil, 0, 0, 0, err
		}
		gatherNs += g
	}
	return lat, wall, gatherNs, scatterNs, nil
}

// postSendersFirst (--sender first or expose) asks every prefill end to post its side of each
// Receive and waits until all have: the answers of an expose run, by request id (one prefill
// rank), carry the params its Receive is given.
func (d *decodeEnd) postSendersFirst(ops []recvOp) (map[uint64]postedMsg, error) {
	if d.flow == SenderExpose && len(d.ctrls) != 1 {
		return nil, fmt.Errorf("--sender expose: one prefill rank only (a Receive carries one sender's params), not %d", len(d.ctrls))
	}
	asked := make([]int, len(d.ctrls))
	for _, op := range ops {
		for _, sub := range op.subs {
			req := op.req
			req.Sender = d.flow
			if err := d.ctrls[sub.prefillRank].send(message{Req: &req}); err != nil {
				return nil, fmt.Errorf("prefill rank %d: %w", sub.prefillRank, err)
			}
			asked[sub.prefillRank]++
		}
	}
	out := make(map[uint64]postedMsg, len(ops))
	for r, c := range d.ctrls {
		for range asked[r] {
			m, err := c.recvMessage(0)
			if err != nil {
				return nil, fmt.Errorf("prefill rank %d: %w", r, err)
			}
			switch {
			case m.Posted == nil:
				return nil, fmt.Errorf("%w: prefill rank %d answered a request with something else than posted", errPeerNotKvxbench, r)
			case m.Posted.Err != "":
				return nil, fmt.Errorf("prefill rank %d: posting %d: %s", r, m.Posted.ID, m.Posted.Err)
			}
			out[m.Posted.ID] = *m.Posted
		}
	}
	for _, op := range ops {
		if _, ok := out[op.req.ID]; !ok {
			return nil, fmt.Errorf("%w: no prefill rank said it posted request %d", errPeerNotKvxbench, op.req.ID)
		}
	}
	return out, nil
}

// receiveExposed posts an expose run's Receive with what the exposure handed out.
func (d *decodeEnd) receiveExposed(ctx context.Context, pm postedMsg, subs []recvSub, m mover) (pendingXfer, error) {
	x, ok := d.eng.(exposer)
	if !ok || len(subs) != 1 {
		return nil, errors.New("--sender expose: this engine cannot receive from an exposure's params")
	}
	return x.ReceiveExposed(ctx, pm.ID, pm.Params, pm.Secret, subs[0], m)
}

// warmUp runs one round of the scenario off the clock and checks its bytes.
func (d *decodeEnd) warmUp(ctx context.Context, plans [][]recvSub, sums [][]uint32, name string) error {
	if _, _, _, _, err := d.round(ctx, plans); err != nil {
		return fmt.Errorf("%s: warm-up: %w", name, err)
	}
	if !d.cfg.Verify {
		return nil
	}
	if err := pullPlans(d.eng, plans, d.pool); err != nil {
		return fmt.Errorf("%s: warm-up: %w", name, err)
	}
	for i := range plans {
		for _, sub := range plans[i] {
			if got, want := streamChecksum(sub.plan, d.pools[sub.decodeRank]), sums[sub.prefillRank][sub.decodeRank]; got != want {
				return fmt.Errorf("%s: warm-up: verification failed: request %d from prefill rank %d to decode rank %d landed with checksum %08x, the sender's stream has %08x",
					name, i, sub.prefillRank, sub.decodeRank, got, want)
			}
		}
	}
	return nil
}

// scrub zeroes the plan's destination bytes in pool, so a transfer that writes nothing (or
// writes short) fails its check instead of passing on the previous round's bytes.
func scrub(p *layout.Plan, pool []byte) {
	run := kvplan.RunUnits(p)
	runBytes := run * p.Layout().RowBytes()
	for u := int64(0); u < kvplan.Units(p); u += run {
		off := kvplan.UnitOffset(p, u)
		clear(pool[off : off+runBytes])
	}
}

// eachParallel runs fn(0..n-1) on up to GOMAXPROCS goroutines and returns the first error.
// The checks and scrubs of a round's requests touch disjoint blocks, so they can share the
// cores; run between rounds, they keep the measurement's wait for them short.
func eachParallel(n int, fn func(i int) error) error {
	workers := min(runtime.GOMAXPROCS(0), n)
	errs := make([]error, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				errs[i] = fn(i)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
