// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/internal/queue"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

var _ transport.Transport = (*ucxTransport)(nil)

// ErrUnregistered: a buffer handed to the UCX transport lies outside the memory UCX has
// mapped for it (Transport.StagingMemory, Transport.RegisterHost). Go memory is never given
// to UCX.
var ErrUnregistered = errors.New("kvxfer: buffer outside UCX-registered memory")

// Defaults of Config's drain fields.
const (
	defaultDrainTimeout = 30 * time.Second
	defaultDrainAhead   = 4
	defaultMaxDrains    = 65536
	// Defaults of Config's receive probe.
	defaultProbeInterval = time.Second
	defaultProbeTimeout  = 10 * time.Second
)

// ucxDrainBytes is the buffer of a drain receive: larger messages are truncated, and UCX
// still answers a truncated rendezvous, which completes the sender's request.
const ucxDrainBytes = 64

// ucxTransport is the transport.Transport over UCX: one context and one worker (its own progress
// goroutine), endpoints made on first use with peer error handling, tagged messages straight
// from and into UCX-mapped staging memory, and control messages as small tagged messages
// carrying the sender's worker address. Peers are named by their worker address in hex
// (PeerFromAddress); a peer that restarts has a new address, so nothing meant for its old
// life reaches the new one. Completions run on the transport's own dispatch goroutine.
type ucxTransport struct {
	cfg     Config
	log     *zap.Logger
	uctx    *native.Context
	w       *native.Worker
	self    transport.Peer
	addr    []byte
	life    uint64 // this transport's incarnation, for ContextParams
	staging *native.Memory
	// noRMA: UCX was opened without RMA (Config.rmaWanted): no gets posted, none served (rma.go)
	noRMA bool

	mu  sync.Mutex
	in  transport.Inbound
	eps map[transport.Peer]*native.Endpoint
	// retired are the endpoints replaceWorker closed, until watch reports their peers (lost,
	// with transport.ErrEndpointRetired: the peer itself may be alive).
	retired map[*native.Endpoint]struct{}
	regions []*native.Memory
	pools   []*native.Memory // AllocatePool's regions, unmapped in Close
	ops     map[transport.OpID]*ucxOp
	byReq   map[*native.Request]*ucxOp
	recvTag map[uint64]transport.OpID // live receives by UCX tag, to refuse a colliding one
	nextOp  transport.OpID
	closed  bool
	ctrl    *native.Request
	rma     ucxRMA                   // rma.go: packed and unpacked RMA keys
	cma     ucxCMA                   // cma.go: gets served by process_vm_readv
	regs    ucxRegs                  // region.go: the caller's registered memory
	gens    ucxGens                  // rma_gen.go: RMA exposures' generation words
	probe   atomic.Pointer[ucxProbe] // probe.go: nil until Bind, or when left out; read without mu
	swaps   int                      // workers replaced (rebirth.go)
	// replaceFailures counts failed replacements since the last success; only the probe's
	// goroutine, which runs replaceWorker, touches it.
	replaceFailures int
	// drains are the receives that stand in for cancelled ones (see Config.drainTimeout),
	// by transfer (the tag without its chunk sequence), by UCX tag, and by request.
	drains     map[uint64]map[uint64]*ucxDrain
	drainByReq map[*native.Request]*ucxDrain
	drainStats drainCounters

	// beforeConnect, when set (tests), runs as a new endpoint is about to be made: a worker
	// round trip of up to CloseTimeout.
	beforeConnect func()
	// beforeUnpack, when set (tests), runs as a peer's remote key is about to be unpacked
	// outside mu (ensureKey): a worker round trip too.
	beforeUnpack func()
	// held refuses new endpoints to a peer whose endpoint just failed (holdoff.go).
	held holdoff

	// tagOwners holds the tag hashes receiving transfers reserved (tags.go).
	tagOwners map[uint64]ucxTagOwner

	reports queue.Queue[ucxReport] // the report queue (dispatch.go)
	// peerNames are the control senders' names by address (dispatch.go, peerOf): only the
	// dispatch goroutine touches them.
	peerNames map[string]transport.Peer
	stop      chan struct{}
	exited    chan struct{}
	once      sync.Once
}

type ucxOp struct {
	id     transport.OpID
	req    *native.Request
	send   bool
	peer   transport.Peer
	size   int
	done   func(transport.Completion)
	tag    uint64
	busy   bool // transport.MemoryBusy reported
	cancel bool
	cma    *ucxCMAGet // cma.go: a get process_vm_readv serves (req is nil)
}

type ucxReport struct {
	req  *native.Request // a request reported by the worker
	busy *ucxOp          // a cancelled send still on the wire
	cma  *ucxOp          // a process_vm_readv get that ended (cma.go), with err
	// cmaUnknown: cma's read was declared blocked, so its memory is unknown
	cmaUnknown bool
	lost       transport.Peer // a peer whose endpoint failed
	err        error
	// connected: a peer this transport just opened an endpoint to (first or again), for
	// the engine's transport.PeerConnectReporter
	connected transport.Peer
}

// New opens UCX, allocates the staging region and starts the dispatch goroutine.
func newTransport(cfg Config) (*ucxTransport, error) {
	if err := cfg.applyDefaults(); err != nil {
		return nil, err
	}
	t := &ucxTransport{cfg: cfg, log: cfg.Logger, noRMA: !cfg.rmaWanted(), eps: map[transport.Peer]*native.Endpoint{}, retired: map[*native.Endpoint]struct{}{}, ops: map[transport.OpID]*ucxOp{},
		byReq: map[*native.Request]*ucxOp{}, recvTag: map[uint64]transport.OpID{}, tagOwners: map[uint64]ucxTagOwner{},
		drains: map[uint64]map[uint64]*ucxDrain{}, drainByReq: map[*native.Request]*ucxDrain{},
		stop: make(chan struct{}), exited: make(chan struct{})}
	uctx, err := native.NewContext(native.ContextConfig{TLS: cfg.TLS, NetDevices: cfg.NetDevices,
		KeepaliveInterval: cfg.KeepaliveInterval, TCPSegmentBytes: cfg.TCPSegmentBytes, ShmFIFOSize: cfg.ShmFIFOSize, Logger: cfg.Logger,
		RendezvousScheme: cfg.rendezvous, NoRMA: t.noRMA})
	if err != nil {
		return nil, err
	}
	w, err := uctx.NewWorker(native.WorkerConfig{OnReport: t.enqueueRequest, Logger: cfg.Logger})
	if err != nil {
		_ = uctx.Close()
		return nil, err
	}
	staging, err := uctx.Allocate(cfg.StagingBytes)
	if err != nil {
		_ = w.Close()
		_ = uctx.Close()
		return nil, err
	}
	t.uctx, t.w, t.staging = uctx, w, staging
	t.addr = w.Address()
	t.self = PeerFromAddress(t.addr)
	t.life = rand.Uint64()
	t.regions = []*native.Memory{staging}
	t.initCMA()
	go t.dispatch()
	return t, nil
}

// Self is this transport's peer name, what the other side passes as transfer.Spec.Peer.
// It changes when the transport replaces a wedged worker (Config.ReplaceWedgedWorker): read it
// per request rather than once.
func (t *ucxTransport) Self() transport.Peer {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.self
}

// WorkerAddress is this transport's UCX worker address (for ContextParams.WorkerAddress).
func (t *ucxTransport) WorkerAddress() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.addr...)
}

// StagingMemory is the UCX-mapped region to pass as transfer.Config.StagingMemory. It is valid until
// Close.
func (t *ucxTransport) StagingMemory() []byte { return t.staging.Bytes() }

// ContextParams describes request id over plan (this side's blocks) for the peer that will
// receive it: what a prefill engine hands to decode. It names no RMA regions whatever path the
// transfer takes: what RMA reads (regions, remote keys) travels in the offer on the engines' wire.
func (t *ucxTransport) ContextParams(id transport.RequestID, plan *layout.Plan) *ContextParams {
	t.mu.Lock()
	life, addr := t.life, append([]byte(nil), t.addr...)
	t.mu.Unlock()
	return &ContextParams{RequestID: id, Incarnation: life, WorkerAddress: addr,
		Layout: plan.Layout(), Selection: plan.Selection(), Blocks: append([]int32(nil), plan.Blocks()...)}
}

// ExposeParams implements transport.ParamsIssuer: ContextParams of request id over plan with
// secret, naming no receiver (Anonymous), with the Exposure section when exposure is not nil,
// for transfer.Engine.Expose.
func (t *ucxTransport) ExposeParams(id transport.RequestID, plan *layout.Plan, secret []byte, exposure *transport.Exposure) (transport.Params, error) {
	cp := t.ContextParams(id, plan)
	cp.Secret, cp.anonymous, cp.exposure = append([]byte(nil), secret...), true, exposure
	if err := cp.Validate(); err != nil {
		return nil, err
	}
	return cp, nil
}

var _ transport.ParamsIssuer = (*ucxTransport)(nil)

// Bind implements transport.Transport.
func (t *ucxTransport) Bind(in transport.Inbound) error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return transport.ErrClosed
	}
	first := t.in == nil
	t.in = in
	t.postControlLocked()
	t.mu.Unlock()
	if first {
		t.startProbe()
	}
	return nil
}

// postControlLocked posts the standing control receive: its worker posts the next one itself
// as each message completes it (native's TagRecvBytesStanding), so a burst of control messages
// is taken in one wake of the worker; deliverRequest follows the chain.
func (t *ucxTransport) postControlLocked() {
	t.ctrl = t.w.TagRecvBytesStanding(t.cfg.maxControlBytes, ucxKindCtrl, ucxKindMask)
}

// ensureEndpoint makes the endpoint to peer if there is none (first use, or the old one
// failed), without holding mu: creating one is a round trip to the worker's thread, which
// takes up to CloseTimeout when the worker is busy, and posts, completions and cancels of
// every other peer must not wait for it. Every method that reaches a peer calls it before
// taking mu; endpointLocked then finds the endpoint made.
func (t *ucxTransport) ensureEndpoint(peer transport.Peer) error {
	t.mu.Lock()
	if ep := t.eps[peer]; t.closed || (ep != nil && ep.Err() == nil) {
		t.mu.Unlock()
		return nil // closed: the caller says so under mu
	}
	w, hook := t.w, t.beforeConnect
	t.mu.Unlock()
	ep, err := t.connect(w, peer, hook)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur := t.eps[peer]; t.closed || t.w != w || (cur != nil && cur.Err() == nil) {
		// Closed, the worker replaced, or another caller made one first: this one goes.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), t.cfg.CloseTimeout)
			defer cancel()
			_ = ep.ForceClose(ctx)
		}()
		return nil
	}
	t.eps[peer] = ep
	go t.watch(peer, ep)
	t.push(ucxReport{connected: peer}) // as endpointLocked does: the observer counts connects
	return nil
}

// connect makes an endpoint to peer on w.
func (t *ucxTransport) connect(w *native.Worker, peer transport.Peer, hook func()) (*native.Endpoint, error) {
	addr, err := hex.DecodeString(string(peer))
	if err != nil || len(addr) == 0 {
		return nil, fmt.Errorf("%w: peer %.16q is not a UCX worker address in hex", transport.ErrInvalidSpec, peer)
	}
	if err := t.held.check(peer); err != nil {
		return nil, err
	}
	if hook != nil {
		hook()
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.CloseTimeout)
	defer cancel()
	ep, err := w.Connect(ctx, addr)
	if err != nil {
		if t.unreachable(ctx, err) {
			// UCX could not reach the address at all (a refused connection, a shared-memory
			// segment whose process is gone): the peer is lost as surely as when an endpoint
			// fails, and the engine must hear it, or a request waits out its queue for a hello
			// nobody sends (UCX's keepalive never runs on an endpoint that was never made).
			t.log.Warn("ucx peer unreachable", zap.String("peer", peer.Short()), zap.Error(err))
			t.held.failed(peer)
			t.push(ucxReport{lost: peer, err: err})
		}
		return nil, fmt.Errorf("%w: connect: %w", transport.ErrPeerLost, err)
	}
	return ep, nil
}

// unreachable reports whether a failed connect says the peer cannot be reached, rather than
// that its address is malformed, this worker closed, or the worker was too busy to answer.
func (t *ucxTransport) unreachable(ctx context.Context, err error) bool {
	return ctx.Err() == nil && !errors.Is(err, native.ErrBadAddress) && !errors.Is(err, native.ErrInvalidArgument) &&
		!errors.Is(err, native.ErrClosed) && !errors.Is(err, native.ErrTimeout)
}

// endpointLocked returns the endpoint to peer. The caller ran ensureEndpoint first, so it
// exists but for a race with its failure; then it is made here, under mu (UCX connects
// lazily, so this is one worker round trip, not a network one).
func (t *ucxTransport) endpointLocked(peer transport.Peer) (*native.Endpoint, error) {
	if ep := t.eps[peer]; ep != nil && ep.Err() == nil {
		return ep, nil
	}
	ep, err := t.connect(t.w, peer, nil)
	if err != nil {
		return nil, err
	}
	t.eps[peer] = ep
	go t.watch(peer, ep)
	t.push(ucxReport{connected: peer}) // from the dispatch goroutine, never inside this call
	return ep, nil
}

// watch reports a peer lost when its endpoint fails, unless the transport is closing.
func (t *ucxTransport) watch(peer transport.Peer, ep *native.Endpoint) {
	select {
	case <-ep.Failed():
	case <-t.stop:
		return
	}
	select {
	case <-t.stop:
		return
	default:
	}
	t.mu.Lock()
	if t.eps[peer] == ep {
		delete(t.eps, peer) // the next operation reconnects
	}
	if l, ok := t.rma.getLanes[peer]; ok && l.ep == ep {
		delete(t.rma.getLanes, peer) // lanes.go: a remade endpoint is asked again
	}
	closed := t.closed // Close force-closed it: the peer is not lost, this side is gone
	_, retired := t.retired[ep]
	delete(t.retired, ep)
	t.mu.Unlock()
	if closed {
		return
	}
	err := ep.Err()
	if retired { // closed by replaceWorker: its transfers fail, the peer is not known dead
		err = fmt.Errorf("%w: %w", transport.ErrEndpointRetired, err)
	}
	if !retired { // a retired endpoint's peer may be alive, and the new worker holds no connection of it
		t.held.failed(peer)
	}
	t.log.Warn("ucx peer lost", zap.String("peer", peer.Short()), zap.Error(err))
	t.push(ucxReport{lost: peer, err: err})
}

// regionLocked finds the registered region holding buf.
func (t *ucxTransport) regionLocked(buf []byte) (*native.Memory, int64, error) {
	if len(buf) == 0 {
		return nil, 0, fmt.Errorf("%w: empty buffer", ErrUnregistered)
	}
	p := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
	for _, m := range t.regions {
		if p >= m.Addr() && p+uint64(len(buf)) <= m.Addr()+uint64(m.Len()) {
			return m, int64(p - m.Addr()), nil
		}
	}
	return nil, 0, fmt.Errorf("%w: [%#x, +%d)", ErrUnregistered, p, len(buf))
}

// ControlRoom implements transport.ControlBound: maxControlBytes less the framing and this worker's
// address, which every control message carries.
func (t *ucxTransport) ControlRoom() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cfg.maxControlBytes - 2 - len(t.addr)
}

// SendControl implements transport.Transport.
func (t *ucxTransport) SendControl(to transport.Peer, msg []byte) error {
	if err := t.ensureEndpoint(to); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(msg)+2+len(t.addr) > t.cfg.maxControlBytes {
		return &transport.ControlSizeError{Bytes: len(msg), Room: t.cfg.maxControlBytes - 2 - len(t.addr), Reason: "with the sender address"}
	}
	if t.closed {
		return transport.ErrClosed
	}
	ep, err := t.endpointLocked(to)
	if err != nil {
		return err
	}
	ep.TagSendBytes(ucxControlFrame(t.addr, msg), ucxKindCtrl) // best effort: its outcome is not the engine's
	return nil
}

// ucxControlFrame is a control message as it goes on the wire: the sender's worker address
// (length-prefixed, which is how the receiver names the sender) and the message.
func ucxControlFrame(from, msg []byte) []byte {
	b := make([]byte, 0, 2+len(from)+len(msg))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(from)))
	b = append(b, from...)
	return append(b, msg...)
}

// PostSend implements transport.Transport.
func (t *ucxTransport) PostSend(to transport.Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return t.post(to, tag, buf, done, true)
}

// PostRecv implements transport.Transport.
func (t *ucxTransport) PostRecv(from transport.Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return t.post(from, tag, buf, done, false)
}

func (t *ucxTransport) post(peer transport.Peer, tag transport.Tag, buf []byte, done func(transport.Completion), send bool) (transport.OpID, error) {
	if err := t.ensureEndpoint(peer); err != nil {
		return 0, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, transport.ErrClosed
	}
	mem, off, err := t.regionLocked(buf)
	if err != nil {
		return 0, err
	}
	ep, err := t.endpointLocked(peer)
	if err != nil {
		return 0, err
	}
	t.nextOp++
	op := &ucxOp{id: t.nextOp, send: send, peer: peer, size: len(buf), done: done}
	if send {
		op.tag = ucxDataTag(t.self, tag)
		op.req = ep.TagSend(mem, off, int64(len(buf)), op.tag)
	} else {
		op.tag = ucxDataTag(peer, tag)
		if other, live := t.recvTag[op.tag]; live {
			return 0, fmt.Errorf("%w: %w: receive tag %#x collides with live op %d", transport.ErrProtocol, transport.ErrTagCollision, op.tag, other)
		}
		t.recvTag[op.tag] = op.id
		t.retireDrainLocked(op.tag)
		op.req = ep.TagRecv(mem, off, int64(len(buf)), op.tag, ^uint64(0))
	}
	t.ops[op.id] = op
	t.byReq[op.req] = op
	return op.id, nil
}

// Cancel implements transport.Transport. A receive is cancelled in UCX (if unmatched, it reports
// transport.ErrCancelled with transport.MemoryDone); a send cannot be, so it reports transport.MemoryBusy now and its final
// verdict when UCX completes it or its endpoint is force-closed.
func (t *ucxTransport) Cancel(id transport.OpID) {
	t.mu.Lock()
	op := t.ops[id]
	if op == nil || op.cancel {
		t.mu.Unlock()
		return
	}
	op.cancel = true
	if op.cma != nil {
		busy := t.cancelCMALocked(op)
		t.mu.Unlock()
		if busy {
			t.push(ucxReport{busy: op})
		}
		return
	}
	t.mu.Unlock()
	if !op.send {
		op.req.Cancel()
		return
	}
	if !op.req.Completed() {
		t.push(ucxReport{busy: op})
	}
}

// Close implements transport.Transport. It closes every endpoint (forced, or flushed within
// CloseTimeout), cancels the control receive, stops the worker (which settles every request:
// once it is gone UCX touches no memory), waits for the process_vm_readv gets at most
// CMAReadTimeout (cma.go: one blocked past it is final already, its destination left
// registered), delivers every final verdict, and releases UCX.
func (t *ucxTransport) Close(force bool) error {
	first := false
	t.once.Do(func() { first = true })
	if !first {
		return nil
	}
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	probe := t.probe.Load()
	probe.close() // before the worker it sends to
	t.mu.Lock()
	w := t.w // a replacement (rebirth.go) saw closed, or finished swapping before it
	for _, d := range t.drainByReq {
		d.timer.Stop() // the worker's close cancels every drain
	}
	eps := make([]*native.Endpoint, 0, len(t.eps))
	for _, ep := range t.eps {
		eps = append(eps, ep)
	}
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.CloseTimeout)
	defer cancel()
	var errs []error
	for _, ep := range eps {
		if force {
			errs = append(errs, ep.ForceClose(ctx))
		} else {
			errs = append(errs, ep.Close(ctx))
		}
	}
	t.closeRMAKeys()
	errs = append(errs, t.closeLanes(ctx, force)) // lanes.go: their requests report as w's do
	errs = append(errs, w.Close())                // settles every request, reporting each
	t.closeCMA()                                  // cma.go: each read final within Config.CMAReadTimeout
	close(t.stop)
	select {
	case <-t.exited:
	case <-time.After(t.cfg.CloseTimeout):
		errs = append(errs, fmt.Errorf("%w: dispatch did not drain within %v", transport.ErrClosed, t.cfg.CloseTimeout))
	}
	for _, m := range t.pools {
		errs = append(errs, m.Close())
	}
	errs = append(errs, t.closeRegions()...)
	errs = append(errs, t.closeGens())
	errs = append(errs, t.staging.Close(), t.uctx.Close())
	return errors.Join(errs...)
}
