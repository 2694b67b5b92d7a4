// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package hostile

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/internal/cmastats"
	"github.com/kvxfer/kvxfer/internal/peerproc/forgery"
	"github.com/kvxfer/kvxfer/internal/peerproc/proc"
	"github.com/kvxfer/kvxfer/internal/transportimpl"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/observe"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
	"github.com/kvxfer/kvxfer/transfer/tuning"
)

// PeerBinEnv names the hostilepeer binary FindPeer returns.
const PeerBinEnv = "KVX_HOSTILEPEER_BIN"

// FindPeer returns the hostilepeer binary: the one $KVX_HOSTILEPEER_BIN names, a
// "hostilepeer" next to this executable, or one it builds with the go command (when this runs
// inside the module's source tree) into a temporary directory that done removes.
func FindPeer() (bin string, done func(), err error) {
	if bin := os.Getenv(PeerBinEnv); bin != "" {
		return bin, func() {}, nil
	}
	if exe, err := os.Executable(); err == nil {
		bin := filepath.Join(filepath.Dir(exe), "hostilepeer")
		if info, err := os.Stat(bin); err == nil && info.Mode().IsRegular() {
			return bin, func() {}, nil
		}
	}
	dir, err := os.MkdirTemp("", "hostilepeer")
	if err != nil {
		return "", nil, err
	}
	bin = filepath.Join(dir, "hostilepeer")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/kvxfer/kvxfer/transfer/internal/hostilepeer").CombinedOutput()
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("no hostilepeer binary: set $%s, or put one next to this executable "+
			"(go build ./transfer/internal/hostilepeer); building one: %w: %s", PeerBinEnv, err, out)
	}
	return bin, func() { _ = os.RemoveAll(dir) }, nil
}

// Config says how to run the harness.
type Config struct {
	// PeerBin is the hostilepeer binary (transfer/internal/hostilepeer). Required.
	PeerBin string
	// TLS and NetDevices configure both sides' UCX ("posix,cma,self"; "tcp,self" with "lo").
	TLS, NetDevices string
	// ClusterKey, when set, is the victim engine's cluster key, and the peer holds it too (an
	// insider of the fleet, who can still lie): the key-only forgeries run then.
	ClusterKey []byte
	// Duration bounds the run: rounds start until it has passed (at least one runs).
	Duration time.Duration
	// MaxRounds bounds the rounds as well (0: Duration alone).
	MaxRounds int
	// Seed varies the peer's pattern and its garbage.
	Seed uint64
	// Logf, when set, hears progress (a line per round).
	Logf func(format string, args ...any)
}

// Report is what a run found. Clean reports whether every expectation held.
type Report struct {
	Rounds int
	// Sent counts the forgeries sent, by forgery; Held those whose every expectation held:
	// refused as they must be (a typed error, or the process_vm_readv route not taken) and
	// counted in the victim's metrics. An honest transfer (and one whose forged pid only
	// kept it off process_vm_readv) holds when it completes with the peer's bytes.
	Sent, Held map[forgery.Forgery]int
	// CanaryBytes is how many canary bytes were checked after each round (the victim's guard
	// pages and unused blocks, its canary at the peer's pool address, the third process's),
	// in all; CanaryChanged how many of those had changed (must be 0).
	CanaryBytes, CanaryChanged int64
	// The victim engine's counters at the end.
	ProtocolRefusals, StaleMessages, HelloRefused, AuthRefused float64
	// PeerExited reports the hostile peer died (its own doing; noted, not a failure).
	PeerExited bool
	// Failures lists every expectation that did not hold, the first 20.
	Failures []string
	failed   int
}

// Clean reports whether nothing failed.
func (r *Report) Clean() bool { return r.failed == 0 }

func (r *Report) fail(format string, args ...any) {
	r.failed++
	if len(r.Failures) < 20 {
		r.Failures = append(r.Failures, fmt.Sprintf(format, args...))
	}
}

// String is the report's summary: one line per forgery, then the totals.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rounds %d, canary bytes checked %d, changed %d, failures %d\n", r.Rounds, r.CanaryBytes, r.CanaryChanged, r.failed)
	for _, f := range forgery.All() {
		if r.Sent[f] > 0 {
			fmt.Fprintf(&b, "  %-21s sent %6d  held %6d\n", f, r.Sent[f], r.Held[f])
		}
	}
	fmt.Fprintf(&b, "  kvxfer_protocol_refusals_total %.0f, kvxfer_stale_messages_total %.0f, kvxfer_hello_refused_total %.0f, kvxfer_auth_refused_total %.0f\n",
		r.ProtocolRefusals, r.StaleMessages, r.HelloRefused, r.AuthRefused)
	for _, f := range r.Failures {
		fmt.Fprintf(&b, "  FAIL %s\n", f)
	}
	return b.String()
}

// guardBytes of canary lie before and after the victim's registered pool.
const guardBytes = 64 << 10

// Bounds of the victim's waits: a transfer's deadline and a refusal's counting (bound), a
// handle's quiescence (quiesceBound). They are generous, as a loaded host needs (a 5 s
// deadline expired once in 642 rounds at a load of 26 on two cores); a forgery is refused
// in milliseconds, so they cost nothing when the host is not loaded.
const (
	bound        = 30 * time.Second
	quiesceBound = 2*bound + 10*time.Second
)

// victim is the decode side: an engine over UCX whose pool is surrounded by canaries.
type victim struct {
	cfg     Config
	rep     *Report
	tr      *ucx.Transport
	eng     *transfer.Engine
	reg     *prometheus.Registry
	mapping []byte // guard | pool | guard, all canary but the request's blocks
	pool    []byte
	plan    *layout.Plan
	want    []byte // the peer's honest stream
	own     []byte // this process's canary at the peer's pool address (nil: that was taken)
	peer    *lines
	third   *lines
	addrs   map[forgery.Forgery]transfer.Peer // who answers each forgery's request
	seq     uint64
}

// Run runs the harness: a hostile peer process and a canary process against an engine of this
// process, for cfg.Duration. The error is for a harness that could not run; what the run
// found is in the Report (Clean).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.PeerBin == "" {
		return nil, errors.New("hostile: Config.PeerBin: required (build transfer/internal/hostilepeer)")
	}
	rep := &Report{Sent: map[forgery.Forgery]int{}, Held: map[forgery.Forgery]int{}}
	v := &victim{cfg: cfg, rep: rep, addrs: map[forgery.Forgery]transfer.Peer{}}
	defer v.close()
	if err := v.start(ctx); err != nil {
		return rep, err
	}
	end, logged := time.Now().Add(cfg.Duration), time.Now()
	for rep.Rounds == 0 || (time.Now().Before(end) && (cfg.MaxRounds == 0 || rep.Rounds < cfg.MaxRounds)) {
		if ctx.Err() != nil {
			break
		}
		if err := v.round(ctx); err != nil {
			return rep, err
		}
		rep.Rounds++
		if cfg.Logf != nil && time.Since(logged) >= 10*time.Second {
			logged = time.Now()
			cfg.Logf("hostile: round %d: %d forgeries sent, %d failures", rep.Rounds, sum(rep.Sent), rep.failed)
		}
	}
	v.finish()
	return rep, nil
}

func sum(m map[forgery.Forgery]int) (n int) {
	for _, v := range m {
		n += v
	}
	return n
}

func (v *victim) start(ctx context.Context) error {
	args := []string{"-mode", "peer", "-tls", v.cfg.TLS, "-seed", fmt.Sprint(v.cfg.Seed)}
	if v.cfg.NetDevices != "" {
		args = append(args, "-net-devices", v.cfg.NetDevices)
	}
	if v.cfg.ClusterKey != nil {
		args = append(args, "-key", hex.EncodeToString(v.cfg.ClusterKey))
	}
	var err error
	// The children live until close, not until ctx ends: ctx ends the run between forgeries.
	if v.peer, err = startLines(context.Background(), v.cfg.PeerBin, args...); err != nil {
		return err
	}
	peerAddr, err := v.peer.expect("ADDR ", 20*time.Second)
	if err != nil {
		return err
	}
	at, err := v.peer.expect("POOL ", 5*time.Second)
	if err != nil {
		return err
	}
	var poolAddr uint64
	var poolLen int
	if _, err := fmt.Sscanf(at, "%d %d", &poolAddr, &poolLen); err != nil {
		return fmt.Errorf("POOL %q: %w", at, err)
	}
	// The third process, its canary where the peer's pool lies; and this process's. That
	// address is where the peer's layout put its pool, and now and then a new process has
	// something of its own there (EEXIST: its heap, a library); another start has another
	// layout, so a few are tried.
	var thirdPid string
	for try := 1; ; try++ {
		if v.third, err = startLines(context.Background(), v.cfg.PeerBin, "-mode", "canary", "-at", fmt.Sprint(poolAddr), "-len", fmt.Sprint(poolLen)); err != nil {
			return err
		}
		if thirdPid, err = v.third.expect("CANARY ", 10*time.Second); err == nil {
			break
		}
		_ = v.third.child.Stop(time.Second, 5*time.Second) // it exits after its ERR
		if try == 5 || !strings.Contains(err.Error(), unix.EEXIST.Error()) {
			return err
		}
	}
	if own, err := forgery.MapAt(uintptr(poolAddr), poolLen); err == nil {
		v.own = own
		fillCanary(own)
	}
	v.want = make([]byte, forgery.PoolBlocks*forgery.BlockBytes)
	forgery.Fill(v.want, v.cfg.Seed)
	v.want = v.want[:forgery.RequestBlocks*forgery.BlockBytes]

	if v.tr, err = ucx.New(ucx.Config{TLS: v.cfg.TLS, NetDevices: v.cfg.NetDevices, KeepaliveInterval: 200 * time.Millisecond,
		// RMA over TCP too (with RMAWhereEmulated below): the harness lies to the RMA route's
		// checks on every transport, so the victim takes that route where UCX emulates it
		StagingBytes: 8 << 20, CloseTimeout: 2 * time.Second, ServeEmulatedRMA: true}); err != nil {
		return err
	}
	v.reg = prometheus.NewRegistry()
	metrics, err := observe.NewMetrics(observe.MetricsConfig{Registerer: v.reg})
	if err != nil {
		return err
	}
	ecfg := transfer.Config{
		SlotBytes:       256 << 10,
		MaxConcurrent:   4,
		StagingMemory:   v.tr.StagingMemory(),
		TransferTimeout: bound,
		QueueTimeout:    bound,
		Observer:        metrics,
		Tuning:          tuning.Config{PipelineDepth: 2, NumSlots: 8, CancelGrace: 50 * time.Millisecond, QuarantineTimeout: 2 * time.Second, RMAMinRegionBytes: 64 << 10, RMAWhereEmulated: true},
	}
	if v.cfg.ClusterKey != nil {
		ecfg.ClusterKeys, ecfg.RequireClaimProof = [][]byte{v.cfg.ClusterKey}, true
	}
	if v.eng, err = transfer.New(v.tr, ecfg); err != nil {
		return err
	}
	if err := metrics.CollectHealth(v.eng); err != nil {
		return err
	}
	// The pool: a registered range of PoolBlocks blocks with guard pages either side, every
	// byte canary but the request's blocks.
	if v.mapping, err = forgery.MapAt(0, forgery.PoolBlocks*forgery.BlockBytes+2*guardBytes); err != nil {
		return err
	}
	fillCanary(v.mapping)
	v.pool = v.mapping[guardBytes : guardBytes+forgery.PoolBlocks*forgery.BlockBytes]
	if _, err := v.tr.RegisterHost(v.pool); err != nil {
		return err
	}
	if v.plan, err = plan(forgery.PoolBlocks, forgery.FirstBlock); err != nil {
		return err
	}
	if err := v.peer.send("PEER " + hex.EncodeToString(v.tr.WorkerAddress())); err != nil {
		return err
	}
	if err := v.peer.send(fmt.Sprintf("PIDS %s %d", thirdPid, os.Getpid())); err != nil {
		return err
	}
	for {
		line, err := v.peer.next(10 * time.Second)
		if err != nil {
			return err
		}
		switch {
		case line == "READY":
			v.addrs[forgery.Honest] = transfer.Peer(peerAddr)
			return nil
		case strings.HasPrefix(line, "FORGED "):
			name, addr, _ := strings.Cut(strings.TrimPrefix(line, "FORGED "), " ")
			if f, ok := forgery.ParseForgery(name); ok {
				v.addrs[f] = transfer.Peer(addr)
			}
		}
	}
}

// dst is the request's blocks in the victim's pool.
func (v *victim) dst() []byte {
	return v.pool[forgery.FirstBlock*forgery.BlockBytes : (forgery.FirstBlock+forgery.RequestBlocks)*forgery.BlockBytes]
}

// round runs every forgery the configuration allows once.
func (v *victim) round(ctx context.Context) error {
	shm := strings.Contains(v.cfg.TLS, "cma")
	keyed := v.cfg.ClusterKey != nil
	for _, f := range forgery.All() {
		switch f {
		case forgery.OutsideRegistration, forgery.PastSegment, forgery.HugeLength:
			// Over TCP the peer's own UCX serves its gets from its own memory: a range outside
			// its registration is memory it chose to send (or a fault in its own process), which
			// no reader can tell from a registration (docs/security.md).
			if !shm {
				continue
			}
		case forgery.PidOfThird, forgery.PidOfVictim:
			if v.addrs[f] == "" {
				continue // no pid in a TCP address
			}
		case forgery.UnsealedHello, forgery.ForeignKeyHello, forgery.UnsignedParams, forgery.ForeignParams, forgery.TamperedParams, forgery.ClaimWithoutProof, forgery.ClaimWrongProof:
			if !keyed {
				continue
			}
		}
		if ctx.Err() != nil {
			return nil // the run is over: the round ends between two forgeries
		}
		// A forgery runs to its end, each wait bounded: ctx ending mid-transfer would cancel
		// it, which is no finding.
		if err := v.forge(context.Background(), f); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		v.checkCanaries(f)
	}
	return v.peerAlive()
}

func (v *victim) peerAlive() error {
	select {
	case <-v.peer.child.Exited():
		v.rep.PeerExited = true
		return fmt.Errorf("the hostile peer exited: %s", v.peer.child.LastLines(5))
	default:
		return nil
	}
}

// forge sends forgery f once and checks the victim refused it.
func (v *victim) forge(ctx context.Context, f forgery.Forgery) error {
	v.rep.Sent[f]++
	before := v.counters()
	refused := false
	switch {
	case f.Offered():
		refused = v.offered(ctx, f, before)
	case f == forgery.HelloForOther || f == forgery.UnsolicitedProof:
		if err := v.peer.sendExpect("SEND "+f.String(), "SENT "); err != nil {
			return err
		}
		refused = v.await(func(c counters) bool { return c.helloRefused > before.helloRefused })
	case f == forgery.UnsealedHello || f == forgery.ForeignKeyHello:
		if err := v.peer.sendExpect("SEND "+f.String(), "SENT "); err != nil {
			return err
		}
		refused = v.await(func(c counters) bool { return c.auth["hello"] > before.auth["hello"] })
	case f == forgery.UnsignedParams || f == forgery.ForeignParams || f == forgery.TamperedParams:
		if err := v.peer.send("PARAMS " + f.String()); err != nil {
			return err
		}
		blob, err := v.peer.expect("PARAMS ", bound)
		if err != nil {
			return err
		}
		b, err := hex.DecodeString(blob)
		if err != nil {
			return err
		}
		p, err := ucx.UnmarshalContextParams(b)
		if err != nil {
			v.rep.fail("%s: the blob did not decode (%v): the forgery is malformed, not forged", f, err)
			return nil
		}
		err = v.eng.VerifyParams(p)
		refused = errors.Is(err, transfer.ErrUnauthenticated) && v.await(func(c counters) bool { return c.auth["params"] > before.auth["params"] })
		if !refused {
			v.rep.fail("%s: VerifyParams: %v", f, err)
		}
	case f == forgery.ClaimWithoutProof || f == forgery.ClaimWrongProof:
		refused = v.claim(ctx, f, before)
	}
	if refused {
		v.rep.Held[f]++
	} else if !f.Offered() && f != forgery.UnsignedParams && f != forgery.ForeignParams && f != forgery.TamperedParams && f != forgery.ClaimWithoutProof && f != forgery.ClaimWrongProof {
		v.rep.fail("%s: not refused and counted within %v", f, bound)
	}
	return nil
}

// offered runs one Receive whose request the peer answers with forgery f.
func (v *victim) offered(ctx context.Context, f forgery.Forgery, before counters) bool {
	peer := v.addrs[forgery.Honest]
	if a := v.addrs[f]; a != "" {
		peer = a
	}
	v.seq++
	id := forgery.RequestID(v.seq, f)
	if f == forgery.ReplayedNonce { // the first transfer of the id, honest; the second meets its replay
		if !v.receive(ctx, f, id, peer, before, true) {
			return false
		}
		before = v.counters()
	}
	return v.receive(ctx, f, id, peer, before, false)
}

func (v *victim) receive(ctx context.Context, f forgery.Forgery, id uint64, peer transfer.Peer, before counters, first bool) bool {
	dst := v.dst()
	clear(dst)
	cma := cmaStats(v.tr)
	h, err := v.eng.Receive(ctx, transfer.Spec{ID: transfer.RequestID(id), Peer: peer, Plan: v.plan, Pool: v.pool, Timeout: bound})
	if err != nil {
		v.rep.fail("%s: Receive: %v", f, err)
		return false
	}
	defer func() { _ = h.Release() }()
	select {
	case <-h.Quiesced():
	case <-time.After(quiesceBound):
		v.rep.fail("%s: request %d not quiesced within %v: %+v", f, id, quiesceBound, h.Status())
		return false
	}
	st := h.Status()
	if leaked := leak(dst); leaked != "" {
		v.rep.fail("%s: %s landed in the pool", f, leaked)
		return false
	}
	switch f {
	case forgery.Honest, forgery.PidOfThird, forgery.PidOfVictim, forgery.ReplayedNonce:
		if st.State != transfer.Completed || !bytes.Equal(dst, v.want) {
			v.rep.fail("%s: want the peer's pool, completed; got %v (%v), bytes equal %v", f, st.State, st.Err, bytes.Equal(dst, v.want))
			return false
		}
		c := v.counters()
		switch {
		case f == forgery.PidOfThird || f == forgery.PidOfVictim:
			if got := cmaStats(v.tr).Gets; got != cma.Gets { // the process named was never read
				v.rep.fail("%s: %d process_vm_readv reads of a process that proved nothing", f, got-cma.Gets)
				return false
			}
		case f == forgery.ReplayedNonce && !first:
			if c.stale <= before.stale {
				v.rep.fail("%s: the replayed offer was not counted stale", f)
				return false
			}
		}
		return true
	}
	if st.State != transfer.Failed || !errors.Is(st.Err, transfer.ErrProtocol) {
		v.rep.fail("%s: want failed with ErrProtocol, got %v (%v)", f, st.State, st.Err)
		return false
	}
	if !bytes.Equal(dst, make([]byte, len(dst))) {
		v.rep.fail("%s: a refused transfer wrote the pool", f)
		return false
	}
	if c := v.counters(); c.refusals <= before.refusals {
		v.rep.fail("%s: refused but not counted (kvxfer_protocol_refusals_total)", f)
		return false
	}
	return true
}

// claim runs a Send that holds a secret and has the peer claim it without proving it.
func (v *victim) claim(ctx context.Context, f forgery.Forgery, before counters) bool {
	v.seq++
	id := forgery.RequestID(v.seq, f)
	secret := transfer.NewClaimSecret()
	h, err := v.eng.Send(ctx, transfer.Spec{ID: transfer.RequestID(id), Peer: v.addrs[forgery.Honest], Plan: v.plan, Pool: v.pool, Secret: secret, Timeout: bound})
	if err != nil {
		v.rep.fail("%s: Send: %v", f, err)
		return false
	}
	defer func() { _ = h.Release() }()
	if err := v.peer.sendExpect(fmt.Sprintf("SEND %s %d", f, id), "SENT "); err != nil {
		v.rep.fail("%s: %v", f, err)
		return false
	}
	refused := v.await(func(c counters) bool { return c.auth["claim"] > before.auth["claim"] })
	v.eng.Cancel(transfer.RequestID(id))
	select {
	case <-h.Quiesced():
	case <-time.After(quiesceBound):
		v.rep.fail("%s: Send %d not quiesced within %v: %+v", f, id, quiesceBound, h.Status())
		return false
	}
	if st := h.Status(); st.State == transfer.Completed {
		v.rep.fail("%s: the Send completed to a claim that proved nothing", f)
		return false
	}
	if !refused {
		v.rep.fail("%s: the claim was not refused and counted within %v", f, bound)
	}
	return refused
}

// leak names what of the peer's secret or a canary lies in b ("" when nothing: no run of 64).
func leak(b []byte) string {
	switch {
	case bytes.Contains(b, bytes.Repeat([]byte{forgery.Secret}, 64)):
		return "the peer's unregistered secret"
	case bytes.Contains(b, bytes.Repeat([]byte{forgery.Canary}, 64)):
		return "canary memory (the third process's, or this process's own)"
	}
	return ""
}

func fillCanary(b []byte) {
	for i := range b {
		b[i] = forgery.Canary
	}
}

// checkCanaries checks every canary byte of this process: the guards and the blocks outside
// the request, and the canary at the peer's pool address.
func (v *victim) checkCanaries(f forgery.Forgery) {
	check := func(what string, b []byte) {
		v.rep.CanaryBytes += int64(len(b))
		if n := changed(b); n > 0 {
			v.rep.CanaryChanged += int64(n)
			v.rep.fail("%s: %d bytes of %s changed", f, n, what)
			fillCanary(b)
		}
	}
	check("the guard before the pool", v.mapping[:guardBytes])
	check("the pool before the request's blocks", v.pool[:forgery.FirstBlock*forgery.BlockBytes])
	check("the pool after the request's blocks", v.pool[(forgery.FirstBlock+forgery.RequestBlocks)*forgery.BlockBytes:])
	check("the guard after the pool", v.mapping[guardBytes+len(v.pool):])
	if v.own != nil {
		check("this process's canary at the peer's pool address", v.own)
	}
}

func changed(b []byte) (n int) {
	for _, c := range b {
		if c != forgery.Canary {
			n++
		}
	}
	return n
}

// finish checks the third process's canary and reads the counters.
func (v *victim) finish() {
	if err := v.third.send("CHECK"); err == nil {
		got, err := v.third.expect("CHECKED ", 10*time.Second)
		n, perr := strconv.Atoi(got)
		switch {
		case err != nil:
			v.rep.fail("the third process did not check its canary: %v", err)
		case perr != nil || n != 0:
			v.rep.CanaryChanged += int64(n)
			v.rep.fail("the third process's canary: %s bytes changed", got)
		}
	}
	if v.own != nil {
		v.rep.CanaryBytes += int64(len(v.own)) // the third's is as large
	}
	c := v.counters()
	v.rep.ProtocolRefusals, v.rep.StaleMessages, v.rep.HelloRefused = float64(c.refusals), float64(c.stale), c.helloRefused
	for _, n := range c.auth {
		v.rep.AuthRefused += n
	}
}

func (v *victim) close() {
	if v.eng != nil {
		_ = v.eng.Close()
	}
	if v.tr != nil {
		_ = v.tr.Close(true)
	}
	for _, l := range []*lines{v.peer, v.third} {
		if l != nil {
			_ = l.child.CloseStdin()
			_ = l.child.Stop(2*time.Second, 10*time.Second)
		}
	}
	for _, m := range [][]byte{v.mapping, v.own} {
		if m != nil {
			_ = unix.Munmap(m)
		}
	}
}

// counters are the victim's refusal counts.
type counters struct {
	refusals, stale int64
	helloRefused    float64
	auth            map[string]float64 // by what
}

func (v *victim) counters() counters {
	h := v.eng.Health()
	c := counters{refusals: h.Numbers.ProtocolRefusals, stale: h.Numbers.StaleMessages, auth: map[string]float64{}}
	mfs, err := v.reg.Gather()
	if err != nil {
		return c
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "kvxfer_hello_refused_total":
				c.helloRefused += m.GetCounter().GetValue()
			case "kvxfer_auth_refused_total":
				for _, l := range m.GetLabel() {
					if l.GetName() == "what" {
						c.auth[l.GetValue()] += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	return c
}

// await polls the counters until ok holds, at most bound (a refusal is counted as the
// engine's observer hears it, asynchronously).
func (v *victim) await(ok func(counters) bool) bool {
	end := time.Now().Add(bound)
	for {
		if ok(v.counters()) {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// lines is a child process speaking the line protocol.
type lines struct {
	child *proc.Child
	ch    chan string
}

func startLines(ctx context.Context, bin string, args ...string) (*lines, error) {
	l := &lines{ch: make(chan string, 1<<12)}
	child, err := proc.Start(ctx, exec.Command(bin, args...), proc.Options{Stdin: true, Stderr: os.Stderr,
		Lines: func(line string) {
			select {
			case l.ch <- line:
			default:
			}
		}})
	if err != nil {
		return nil, err
	}
	l.child = child
	return l, nil
}

func (l *lines) send(line string) error { return l.child.Send(line) }

func (l *lines) next(d time.Duration) (string, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case line := <-l.ch:
		if rest, ok := strings.CutPrefix(line, "ERR "); ok {
			return "", fmt.Errorf("hostilepeer: %s", rest)
		}
		return line, nil
	case <-l.child.Exited():
		select {
		case line := <-l.ch:
			return line, nil
		default:
		}
		return "", fmt.Errorf("hostilepeer exited: %s", l.child.LastLines(5))
	case <-t.C:
		return "", fmt.Errorf("no line from hostilepeer within %v", d)
	}
}

// expect returns the rest of the next line with prefix, skipping others, within d.
func (l *lines) expect(prefix string, d time.Duration) (string, error) {
	end := time.Now().Add(d)
	for {
		line, err := l.next(time.Until(end))
		if err != nil {
			return "", fmt.Errorf("waiting for %q: %w", prefix, err)
		}
		if rest, ok := strings.CutPrefix(line, prefix); ok {
			return rest, nil
		}
	}
}

func (l *lines) sendExpect(line, prefix string) error {
	if err := l.send(line); err != nil {
		return err
	}
	_, err := l.expect(prefix, bound)
	return err
}

// plan is the plan of forgery.RequestBlocks blocks from first in a block-major pool of blocks
// blocks of the harness's model.
func plan(blocks int64, first int32) (*layout.Plan, error) {
	l := layout.Packed(layout.Dims{NumLayers: forgery.NumLayers, KVFactor: forgery.KVFactor, NumHeads: forgery.NumHeads,
		HeadDim: forgery.HeadDim, ElemSize: forgery.ElemSize, TokensPerBlock: forgery.TokensPerBlock, NumBlocks: blocks}, layout.BlockMajor)
	ids := make([]int32, forgery.RequestBlocks)
	for i := range ids {
		ids[i] = first + int32(i)
	}
	return layout.NewPlan(l, l.All(), ids)
}

// cmaStats reads the UCX transport's process_vm_readv counts (from its implementation:
// internal/transportimpl).
func cmaStats(tr *ucx.Transport) cmastats.Stats {
	return transportimpl.Of(tr).(interface{ CMAStats() cmastats.Stats }).CMAStats()
}
