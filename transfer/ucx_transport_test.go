// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
	"github.com/kvxfer/kvxfer/transfer/tuning"
)

// The transports the UCX engine tests run over (loopback only).
// The device transport's mover is the engine's Mover.
var _ Mover = (*ucx.DeviceMover)(nil)

var ucxTransports = []ucxTestTransport{
	{"shm", "posix,cma,self", ""},
	{"tcp", "tcp,self", "lo"},
}

type ucxTestTransport struct{ name, tls, dev string }

// ucxSysv is shared memory through UCX's sysv transport instead of posix. Wherever UCX_TLS leaves
// both in (UCX's own choice, the engine's default), UCX gives an endpoint's active messages to
// sysv, whose receive FIFO a dead or frozen peer leaves behind as posix's (docs/ucx.md, "The
// sysv FIFO too"). The tests with a peer process that is killed or frozen on every path run it
// besides ucxTransports (ucxLifecycleTransports); the others keep posix's row alone for the
// suite's time.
var ucxSysv = ucxTestTransport{"shm-sysv", "sysv,cma,self", ""}

// ucxLifecycleTransports are ucxTransports and ucxSysv.
var ucxLifecycleTransports = append(ucxTransports[:len(ucxTransports):len(ucxTransports)], ucxSysv)

// ucxShm reports whether the test transport named name is shared memory (posix or sysv).
func ucxShm(name string) bool { return name == "shm" || name == ucxSysv.name }

// ucxEngine is an Engine over a ucx.Transport.
type ucxEngine struct {
	tr *ucx.Transport
	e  *Engine
}

// newUCXEngine is an Engine over a ucx.Transport; mods adjust the transport's configuration.
func newUCXEngine(t testing.TB, tls, dev string, cfg Config, mods ...func(*ucx.Config)) *ucxEngine {
	t.Helper()
	return newUCXEngineOver(t, tls, dev, cfg, nil, mods...)
}

// newUCXEngineOver is newUCXEngine with the engine over wrap(the transport's implementation)
// when wrap is not nil: a test's wrapper, which embeds ucxImpl and so keeps every capability.
func newUCXEngineOver(t testing.TB, tls, dev string, cfg Config, wrap func(ucxImpl) Transport, mods ...func(*ucx.Config)) *ucxEngine {
	t.Helper()
	// The transport's sizes come from the defaults; New takes cfg as given and applies them
	// itself: applied twice, a count set to tuning.None (zero) would turn into its default.
	d := cfg.withDefaults()
	if cfg.Tuning.NumSlots == 0 {
		cfg.Tuning.NumSlots = d.MaxConcurrent * d.Tuning.PipelineDepth
	}
	uc := ucx.Config{TLS: tls, NetDevices: dev, KeepaliveInterval: 200 * time.Millisecond,
		StagingBytes: int64(cfg.Tuning.NumSlots) * d.SlotBytes, CloseTimeout: 2 * time.Second,
		ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 3 * time.Second, ServeEmulatedRMA: d.Tuning.RMAWhereEmulated}
	for _, m := range mods {
		m(&uc)
	}
	tr, err := ucx.New(uc)
	require.NoError(t, err)
	cfg.StagingMemory = tr.StagingMemory()
	var engTr Transport = tr
	if wrap != nil {
		engTr = wrap(ucxOf(tr))
	}
	e, err := New(engTr, cfg)
	require.NoError(t, err)
	u := &ucxEngine{tr: tr, e: e}
	t.Cleanup(func() { _ = e.Close() })
	return u
}

// ucxKV is a KV pool in Go memory (the engine gathers and scatters through staging slots, so
// the caller's pool is never handed to UCX) with a plan over some blocks.
type ucxKV struct {
	mem  []byte
	plan *layout.Plan
}

func newUCXKV(t testing.TB, d layout.Dims, o layout.Order, blockIDs []int32, seed uint64) *ucxKV {
	t.Helper()
	l := layout.Packed(d, o)
	mem := make([]byte, l.SpanBytes())
	if seed != 0 {
		var key [32]byte
		key[0], key[1] = byte(seed), byte(seed>>8)
		_, _ = rand.NewChaCha8(key).Read(mem) // never fails
	}
	p, err := layout.NewPlan(l, l.All(), blockIDs)
	require.NoError(t, err)
	return &ucxKV{mem: mem, plan: p}
}

func (k *ucxKV) stream(t testing.TB) []byte {
	t.Helper()
	b := make([]byte, k.plan.Bytes())
	require.NoError(t, layouttest.ReferenceGather(k.plan, k.mem, b))
	return b
}

// ucxTestConfig is the UCX tests' engine. QueueTimeout is far: no test here is about it, and
// a Send waits in the queue for its receiver's request, which a peer process started under a
// loaded host's -race run sent more than 10s late (TestUCXTransport_ReceiverKilledWhileWeSend's
// second peer).
func ucxTestConfig() Config {
	return Config{
		SlotBytes:        256 << 10,
		MaxConcurrent:    8,
		TransferTimeout:  10 * time.Second,
		QueueTimeout:     time.Minute,
		ProgressDeadline: 2 * time.Second,
		CloseTimeout:     5 * time.Second,
		Tuning:           tuning.Config{PipelineDepth: 2, QuarantineTimeout: 2 * time.Second, CancelGrace: 50 * time.Millisecond, RetryInterval: 50 * time.Millisecond, DirectMinRunBytes: tuning.None},
	} // the test layouts' rows are a few hundred bytes: every path stays reachable
}

// Two engines in one process over UCX, shared memory and TCP: requests of several shapes and
// orders, many concurrently, every byte checked against the reference gather.
func TestUCXTransport_TwoEnginesEveryByteChecked(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			src := newUCXEngine(t, tr.tls, tr.dev, ucxTestConfig())
			dst := newUCXEngine(t, tr.tls, tr.dev, ucxTestConfig())
			const requests = 24
			type pairKV struct {
				s, r   *ucxKV
				hs, hr *Handle
			}
			var all []pairKV
			for i := 0; i < requests; i++ {
				n := int32(1 + i*5%40)
				sb := make([]int32, n)
				rb := make([]int32, n)
				for j := range sb {
					sb[j] = (int32(i)*7 + int32(j)*3) % int32(dims.NumBlocks)
					rb[j] = (int32(i)*11 + int32(j)*5 + 1) % int32(dims.NumBlocks)
				}
				sb, rb = uniqueBlocks(sb), uniqueBlocks(rb)
				n = int32(min(len(sb), len(rb)))
				sb, rb = sb[:n], rb[:n]
				s := newUCXKV(t, dims, layout.Order(i%3), sb, uint64(i+1))
				r := newUCXKV(t, dims, layout.Order((i+1)%3), rb, 0)
				id := RequestID(1000 + i)
				var p pairKV
				p.s, p.r = s, r
				// Prefill hands decode a ucx.ContextParams blob; decode finds the sender and
				// checks the shapes from it alone.
				blob, err := src.tr.ContextParams(id, s.plan).MarshalBinary()
				require.NoError(t, err)
				params, err := ucx.UnmarshalContextParams(blob)
				require.NoError(t, err)
				sendPlan, err := params.Plan()
				require.NoError(t, err)
				require.NoError(t, layout.Compatible(sendPlan, r.plan))
				require.Equal(t, src.tr.Self(), ucx.PeerFromAddress(params.WorkerAddress))
				if i%2 == 0 {
					p.hr, err = dst.e.Receive(bg, Spec{ID: params.RequestID, Peer: ucx.PeerFromAddress(params.WorkerAddress), Plan: r.plan, Pool: r.mem})
					require.NoError(t, err)
					p.hs, err = src.e.Send(bg, Spec{ID: id, Peer: dst.tr.Self(), Plan: s.plan, Pool: s.mem})
					require.NoError(t, err)
				} else {
					p.hs, err = src.e.Send(bg, Spec{ID: id, Peer: dst.tr.Self(), Plan: s.plan, Pool: s.mem})
					require.NoError(t, err)
					p.hr, err = dst.e.Receive(bg, Spec{ID: id, Peer: src.tr.Self(), Plan: r.plan, Pool: r.mem})
					require.NoError(t, err)
				}
				all = append(all, p)
			}
			for i, p := range all {
				for _, h := range []*Handle{p.hs, p.hr} {
					waitQuiesced(t, h, 30*time.Second)
					st := h.Status()
					require.Equal(t, Completed, st.State, "request %d: %v", i, st.Err)
					require.Equal(t, p.s.plan.Bytes(), st.Bytes)
				}
				require.True(t, bytes.Equal(p.s.stream(t), p.r.stream(t)), "request %d: streams differ", i)
			}
			require.True(t, src.e.Health().Healthy, src.e.Health().Reason)
			require.True(t, dst.e.Health().Healthy, dst.e.Health().Reason)
		})
	}
}

func uniqueBlocks(b []int32) []int32 {
	seen := map[int32]bool{}
	out := b[:0:0]
	for _, x := range b {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// A 4096-token Llama-3-8B-shaped request through two engines over shared memory, with the
// default 4 MiB slots: 512 MiB, every byte checked.
func TestUCXTransport_Request4096Tokens(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the 512 MiB transfer is left out")
	}
	dims := layout.Dims{NumLayers: 32, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 256}
	cfg := ucxTestConfig()
	cfg.SlotBytes = 4 << 20
	cfg.MaxConcurrent = 2
	cfg.Tuning.PipelineDepth = 4
	cfg.TransferTimeout = 60 * time.Second
	src := newUCXEngine(t, "posix,cma,self", "", cfg)
	dst := newUCXEngine(t, "posix,cma,self", "", cfg)
	ids := make([]int32, 256)
	for i := range ids {
		ids[i] = int32(i)
	}
	s := newUCXKV(t, dims, layout.LayerMajor, ids, 7)
	r := newUCXKV(t, dims, layout.LayerMajor, ids, 0)
	require.Equal(t, int64(512<<20), s.plan.Bytes())
	start := time.Now()
	hr, err := dst.e.Receive(bg, Spec{ID: 1, Peer: src.tr.Self(), Plan: r.plan, Pool: r.mem})
	require.NoError(t, err)
	hs, err := src.e.Send(bg, Spec{ID: 1, Peer: dst.tr.Self(), Plan: s.plan, Pool: s.mem})
	require.NoError(t, err)
	waitQuiesced(t, hs, 60*time.Second)
	waitQuiesced(t, hr, 60*time.Second)
	t.Logf("512 MiB through two engines over shared memory (staging) in %v", time.Since(start))
	require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
	require.True(t, bytes.Equal(s.mem, r.mem), "every byte")
}

// The sending process dies mid-transfer, for real: its sends stall after a few chunks (so
// the request can never finish first), then its UCX transport is force-closed under its
// engine, with no abort sent, as a crashed process vanishes. The receiver's handle must end
// within its deadline with the peer lost or the deadline passed (never a peer's abort: the
// dead peer sent none), quiesce within the quarantine bound with every slot accounted, and a
// new sender must work again with health back to healthy.
func TestUCXTransport_SenderLostMidTransfer(t *testing.T) {
	dims := layout.Dims{NumLayers: 8, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 128}
	const stallAfter = 4 // chunks the sender sends before it stalls
	// Each transport has its own engines, and waits for the loss: both at once.
	rows := newRowGroup(t, len(ucxTransports))
	defer rows.wait()
	for _, tr := range ucxTransports {
		rows.run(tr.name, func(t *testing.T) {
			cfg := ucxTestConfig()
			cfg.TransferTimeout = 2 * time.Second
			cfg.Tuning.DisablePull = true // the stall holds sends: the chunks must go as messages
			dst := newUCXEngine(t, tr.tls, tr.dev, cfg)
			src := newStallingUCXEngine(t, tr.tls, tr.dev, cfg, stallAfter)
			s := newUCXKV(t, dims, layout.BlockMajor, seqBlocks(0, 32), 3) // 16 MiB
			r := newUCXKV(t, dims, layout.BlockMajor, seqBlocks(0, 32), 0)
			require.Greater(t, s.plan.Bytes(), int64(2*stallAfter)*cfg.SlotBytes, "the request must outlast the stall")
			hr, err := dst.e.Receive(bg, Spec{ID: 9, Peer: src.tr.Self(), Plan: r.plan, Pool: r.mem})
			require.NoError(t, err)
			_, err = src.e.Send(bg, Spec{ID: 9, Peer: dst.tr.Self(), Plan: s.plan, Pool: s.mem})
			require.NoError(t, err)
			// Every slot of the sender parked in a stalled send: its real sends are all done, and
			// nothing of it touches its staging memory again, which the close below unmaps.
			eventually(t, func() bool { return src.st.heldCount() == cfg.Tuning.PipelineDepth }, "the sender stalled")
			eventually(t, func() bool { return hr.Status().Bytes > 0 }, "chunks before the stall arrived")

			start := time.Now()
			defer func() { t.Logf("%v in all after the sender vanished", time.Since(start)) }()
			require.NoError(t, src.tr.Close(true)) // the sender's process vanishes: no abort
			select {
			case <-hr.Done():
			case <-time.After(cfg.TransferTimeout + 5*time.Second):
				t.Fatalf("receiver not done %v after its sender vanished: %+v", time.Since(start), hr.Status())
			}
			st := hr.Status()
			t.Logf("receiver: %v after %v, %d of %d bytes (%v)", st.State, time.Since(start), st.Bytes, st.Total, st.Err)
			require.NotEqual(t, Completed, st.State)
			require.Less(t, st.Bytes, st.Total)
			require.NotErrorIs(t, st.Err, ErrPeerAborted, "the dead sender sent no abort")
			require.True(t, errors.Is(st.Err, ErrPeerLost) || errors.Is(st.Err, ErrDeadline), "%v", st.Err)
			waitQuiesced(t, hr, cfg.Tuning.QuarantineTimeout+5*time.Second)
			ps := dst.e.pool.Stats()
			require.Equal(t, ps.Total, ps.Free+ps.Leased+ps.Poisoned)
			require.Zero(t, ps.Leased)

			t.Logf("receiver quiesced %v after the sender vanished", time.Since(start))

			// A new sender at a new address works: the engine is healthy again.
			src2 := newUCXEngine(t, tr.tls, tr.dev, cfg)
			// The short deadline was for the failure; this one only has to finish.
			hr2, err := dst.e.Receive(bg, Spec{ID: 10, Peer: src2.tr.Self(), Plan: r.plan, Pool: r.mem, Timeout: 30 * time.Second})
			require.NoError(t, err)
			hs2, err := src2.e.Send(bg, Spec{ID: 10, Peer: dst.tr.Self(), Plan: s.plan, Pool: s.mem, Timeout: 30 * time.Second})
			require.NoError(t, err)
			waitQuiesced(t, hr2, 30*time.Second)
			waitQuiesced(t, hs2, 30*time.Second)
			require.Equal(t, Completed, hr2.Status().State, "%v", hr2.Status().Err)
			require.True(t, bytes.Equal(s.stream(t), r.stream(t)))
			require.Eventually(t, func() bool { return dst.e.Health().Healthy }, 10*time.Second, 10*time.Millisecond,
				"health: %s", dst.e.Health().Reason)
		})
	}
}

// stallingUCX is a ucx.Transport whose sends after the first n never reach UCX: the sending
// engine stalls there for good, as a process that hangs mid-transfer. Close ends the held
// sends (memory done: they never reached UCX).
type stallingUCX struct {
	ucxImpl
	n int

	mu   sync.Mutex
	sent int
	held map[transport.OpID]func(transport.Completion)
	next transport.OpID
}

func (s *stallingUCX) PostSend(to Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	s.mu.Lock()
	if s.sent < s.n {
		s.sent++
		s.mu.Unlock()
		return s.ucxImpl.PostSend(to, tag, buf, done)
	}
	s.next++
	id := transport.OpID(1)<<62 | s.next
	s.held[id] = done
	s.mu.Unlock()
	return id, nil
}

func (s *stallingUCX) heldCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held)
}

func (s *stallingUCX) Cancel(id transport.OpID) {
	if id&(transport.OpID(1)<<62) == 0 {
		s.ucxImpl.Cancel(id)
	}
}

func (s *stallingUCX) Close(force bool) error {
	s.mu.Lock()
	held := s.held
	s.held = map[transport.OpID]func(transport.Completion){}
	s.mu.Unlock()
	for _, done := range held {
		done(transport.Completion{Err: ErrClosed, Memory: transport.MemoryDone})
	}
	return s.ucxImpl.Close(force)
}

type stallingEngine struct {
	*ucxEngine
	st *stallingUCX
}

// newStallingUCXEngine is newUCXEngine over a stallingUCX that stalls after n sends.
func newStallingUCXEngine(t testing.TB, tls, dev string, cfg Config, n int) *stallingEngine {
	t.Helper()
	cfg = cfg.withDefaults()
	if cfg.Tuning.NumSlots == 0 {
		cfg.Tuning.NumSlots = cfg.MaxConcurrent * cfg.Tuning.PipelineDepth
	}
	tr, err := ucx.New(ucx.Config{TLS: tls, NetDevices: dev, KeepaliveInterval: 200 * time.Millisecond,
		StagingBytes: int64(cfg.Tuning.NumSlots) * cfg.SlotBytes, CloseTimeout: 2 * time.Second,
		ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 3 * time.Second, ServeEmulatedRMA: cfg.Tuning.RMAWhereEmulated})
	require.NoError(t, err)
	cfg.StagingMemory = tr.StagingMemory()
	st := &stallingUCX{ucxImpl: ucxOf(tr), n: n, held: map[transport.OpID]func(transport.Completion){}}
	e, err := New(st, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return &stallingEngine{ucxEngine: &ucxEngine{tr: tr, e: e}, st: st}
}
