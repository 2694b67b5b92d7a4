// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvxfer/kvxfer/internal/transportimpl"
	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

var _ transport.RMATransport = (*ucxTransport)(nil)

// ucxRMA holds the UCX transport's RMA keys, under ucxTransport.mu: each mapped region's key
// packed once, and each peer's key unpacked once per endpoint (never per block or per get).
type ucxRMA struct {
	packed   map[*native.Memory][]byte
	keys     map[ucxKeyID]*ucxRemoteKey
	getLanes map[transport.Peer]ucxGetLanes // lanes.go: whether gets to a peer are native, per endpoint
	lanes    ucxLanes                       // lanes.go: the workers gets are striped over
}

type ucxKeyID struct {
	peer transport.Peer
	key  string
	lane int // a key is unpacked on each lane's endpoint to the peer
}

// ucxRemoteKey is an unpacked peer key. It is destroyed once its endpoint failed or was
// replaced (dead) and no get that uses it is still in UCX.
type ucxRemoteKey struct {
	rk       *native.RemoteKey
	ep       *native.Endpoint
	inflight int
	dead     bool
	cma      ucxCMARoute // lane 0's key: whether gets through it go by process_vm_readv (cma.go)
	// proving is closed once the get deciding cma has decided it; the others wait for it.
	proving chan struct{}
}

var _ transportimpl.RMAServing = (*ucxTransport)(nil)

// ServesRMA implements transportimpl.RMAServing: false when this transport opened UCX without RMA
// (its transports are TCP only and Config.ServeEmulatedRMA is off).
func (t *ucxTransport) ServesRMA() bool { return !t.noRMA }

// rmaRefused is the error of an RMA call on a transport that opened UCX without RMA, or nil:
// a *transport.ConfigError (transport.ErrInvalidConfig) naming the setting. UCX itself would
// refuse the get (UCS_ERR_INVALID_PARAM); this says why before it is asked.
func (t *ucxTransport) rmaRefused(what string) error {
	if !t.noRMA {
		return nil
	}
	return &transport.ConfigError{Field: "ucx.Config.ServeEmulatedRMA", Value: false,
		Reason: fmt.Sprintf("%s: this transport's transports (TLS %q) are TCP only, so it opened UCX without RMA (docs/security.md); the engine moves the data by messages", what, t.cfg.TLS)}
}

// RMAKey implements transport.RMATransport: pool must lie in a region this transport mapped
// (AllocatePool, or the staging region); its key is packed on first use.
func (t *ucxTransport) RMAKey(pool []byte) (uint64, []byte, error) {
	if err := t.rmaRefused("a remote key for gets"); err != nil {
		return 0, nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, nil, transport.ErrClosed
	}
	mem, off, err := t.regionLocked(pool)
	if err != nil {
		return 0, nil, err
	}
	key := t.rma.packed[mem]
	if key == nil {
		if key, err = mem.PackRemoteKey(); err != nil {
			return 0, nil, fmt.Errorf("kvxfer: packing the pool's remote key: %w", err)
		}
		if t.rma.packed == nil {
			t.rma.packed = map[*native.Memory][]byte{}
		}
		t.rma.packed[mem] = key
	}
	return mem.Addr() + uint64(off), key, nil
}

// PrepareKeys implements transport.RMAKeyPreparer: the pool's key is unpacked on every lane's endpoint
// to from, once, outside mu (ensureKey); the gets find it unpacked.
func (t *ucxTransport) PrepareKeys(from transport.Peer, poolKey []byte) error {
	if err := t.rmaRefused("a key for gets"); err != nil {
		return err
	}
	if err := t.ensureEndpoint(from); err != nil {
		return err
	}
	lanes := 1
	if t.stripesGets(from) {
		t.startLanes()
		if err := t.ensureLaneEndpoints(from); err != nil {
			return err
		}
		t.mu.Lock()
		lanes += len(t.rma.lanes.extra)
		t.mu.Unlock()
	}
	for lane := range lanes {
		if err := t.ensureKey(from, lane, poolKey); err != nil {
			return err
		}
	}
	return nil
}

// PostGet implements transport.RMATransport with one ucp_get_nbx into mapped memory. UCX cannot cancel
// a get, so the operation is marked as a send is: Cancel reports it transport.MemoryBusy while it runs,
// and a forced close of its endpoint ends it. Where UCX would emulate the get and the peer is a
// process on this host, process_vm_readv reads it instead (cma.go), with the same reports.
func (t *ucxTransport) PostGet(from transport.Peer, tag transport.Tag, key []byte, addr uint64, dst []byte, done func(transport.Completion)) (transport.OpID, error) {
	if err := t.rmaRefused("a get"); err != nil {
		return 0, err
	}
	if err := t.ensureEndpoint(from); err != nil {
		return 0, err
	}
	if k, ok := t.cmaRoute(from, key, false); ok {
		if id, taken, err := t.postCMAGet(from, k, key, addr, dst, done); taken {
			return id, err
		}
	}
	stripe := t.stripesGets(from)
	if stripe {
		t.startLanes()
		if err := t.ensureLaneEndpoints(from); err != nil {
			return 0, err
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, transport.ErrClosed
	}
	mem, off, err := t.regionLocked(dst)
	if err != nil {
		return 0, err
	}
	lane := 0
	if stripe {
		lane = t.nextLaneLocked()
	}
	ep, err := t.laneEndpointLocked(lane, from)
	if err != nil {
		return 0, err
	}
	rk, err := t.remoteKeyLocked(from, lane, ep, key)
	if err != nil {
		return 0, err
	}
	t.nextOp++
	op := &ucxOp{id: t.nextOp, send: true, peer: from, size: len(dst)}
	rk.inflight++
	op.done = func(c transport.Completion) {
		if c.Memory != transport.MemoryBusy {
			t.keyUnused(rk)
		}
		done(c)
	}
	op.req = ep.Get(mem, off, int64(len(dst)), addr, rk.rk)
	t.ops[op.id] = op
	t.byReq[op.req] = op
	return op.id, nil
}

// ensureKey unpacks peer's key on lane's endpoint unless it is unpacked there already,
// without holding mu: unpacking is a round trip to the endpoint's worker (up to CloseTimeout
// when it is busy), and posts, completions and cancels must not wait for it. remoteKeyLocked
// then finds the key; it unpacks under mu only when the endpoint was replaced in between.
func (t *ucxTransport) ensureKey(peer transport.Peer, lane int, key []byte) error {
	id := ucxKeyID{peer: peer, key: string(key), lane: lane}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return transport.ErrClosed
	}
	ep, err := t.laneEndpointLocked(lane, peer)
	if err != nil {
		t.mu.Unlock()
		return err
	}
	if k := t.rma.keys[id]; k != nil && k.ep == ep {
		t.mu.Unlock()
		return nil
	}
	hook := t.beforeUnpack
	t.mu.Unlock()
	if hook != nil {
		hook()
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.CloseTimeout)
	defer cancel()
	rk, err := ep.UnpackRemoteKey(ctx, key)
	if err != nil {
		return unpackError(err, peer)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if k := t.rma.keys[id]; t.closed || (k != nil && k.ep == ep) || ep.Err() != nil {
		rk.Close() // closed, unpacked by another caller meanwhile, or its endpoint failed
		return nil
	}
	if k := t.rma.keys[id]; k != nil {
		delete(t.rma.keys, id)
		t.retireKeyLocked(k)
	}
	t.addKeyLocked(id, &ucxRemoteKey{rk: rk, ep: ep})
	return nil
}

// remoteKeyLocked returns peer's key unpacked on ep, unpacking it on first use. A key
// unpacked on an endpoint that has since been replaced is dropped.
func (t *ucxTransport) remoteKeyLocked(peer transport.Peer, lane int, ep *native.Endpoint, key []byte) (*ucxRemoteKey, error) {
	id := ucxKeyID{peer: peer, key: string(key), lane: lane}
	if k := t.rma.keys[id]; k != nil {
		if k.ep == ep {
			return k, nil
		}
		delete(t.rma.keys, id)
		t.retireKeyLocked(k)
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.CloseTimeout)
	defer cancel()
	rk, err := ep.UnpackRemoteKey(ctx, key)
	if err != nil {
		return nil, unpackError(err, peer)
	}
	k := &ucxRemoteKey{rk: rk, ep: ep}
	t.addKeyLocked(id, k)
	return k, nil
}

// addKeyLocked records an unpacked key; the first on an endpoint starts the watch that
// drops them all when it fails.
func (t *ucxTransport) addKeyLocked(id ucxKeyID, k *ucxRemoteKey) {
	if t.rma.keys == nil {
		t.rma.keys = map[ucxKeyID]*ucxRemoteKey{}
	}
	first := true
	for _, other := range t.rma.keys {
		first = first && other.ep != k.ep
	}
	t.rma.keys[id] = k
	if first {
		go t.dropKeysOnFailure(k.ep)
	}
}

// dropKeysOnFailure destroys the keys unpacked on ep once it fails or closes (each when its
// last get is over), so a peer's keys do not outlive its endpoint.
func (t *ucxTransport) dropKeysOnFailure(ep *native.Endpoint) {
	select {
	case <-ep.Failed():
	case <-t.stop:
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, k := range t.rma.keys {
		if k.ep == ep {
			delete(t.rma.keys, id)
			t.retireKeyLocked(k)
		}
	}
}

// retireKeyLocked marks k dead and destroys it if no get uses it.
func (t *ucxTransport) retireKeyLocked(k *ucxRemoteKey) {
	k.dead = true
	if k.inflight == 0 && k.rk != nil {
		k.rk.Close()
		k.rk = nil
		closeRoute(&k.cma) // cma.go: its pidfd
	}
}

// keyUnused records a get's final completion.
func (t *ucxTransport) keyUnused(k *ucxRemoteKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k.inflight--
	if k.dead {
		t.retireKeyLocked(k)
	}
}

// closeRMAKeys destroys every unpacked key no get uses any more, before Close stops the
// worker (a key in use goes with the worker).
func (t *ucxTransport) closeRMAKeys() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, k := range t.rma.keys {
		delete(t.rma.keys, id)
		t.retireKeyLocked(k)
	}
}

// unpackError is why a peer's key could not be unpacked: a key refused (or one UCX failed) is a
// protocol violation; an endpoint that failed or was closed meanwhile (the peer left: its
// goodbye closes the connection) is the peer's loss, not a refusal of its input
// (TestL11_UCXClosingSenderEndsItsWaitingReceivers met one in rehearsal ci13).
func unpackError(err error, peer transport.Peer) error {
	if errors.Is(err, native.ErrClosed) || errors.Is(err, native.ErrPeerUnreachable) {
		return fmt.Errorf("unpacking the peer's remote key: %w", ucxError(err, peer))
	}
	return fmt.Errorf("%w: unpacking the peer's remote key: %w", transport.ErrProtocol, err)
}
