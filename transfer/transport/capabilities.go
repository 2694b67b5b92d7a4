// SPDX-License-Identifier: Apache-2.0

package transport

import "github.com/kvxfer/kvxfer/layout"

// Optional capabilities. The engine asks for each with a type assertion on the Transport it
// was given (database/sql/driver's style), never with a flag: a transport that lacks one
// still serves every transfer, on the staging path.

// DirectTransport is an optional extension of Transport for the one-copy path: the transport
// reads a chunk straight out of the sender's KV pool and writes it straight into the
// receiver's, as an IOV (a list of pool ranges, the plan's runs) instead of one staging
// buffer. It spares the gather and scatter copies and the per-chunk slot turnover; the
// lifecycle is the same one (the same states, cancel outcomes, deadlines and quarantine),
// only the memory the transport touches is the caller's, not a slot.
//
// The callback rules of Transport hold for these operations too. Every slice of iov lies in
// a pool for which Direct returned true.
type DirectTransport interface {
	Transport
	// Direct reports whether the transport may read and write pool in place: for UCX, the
	// pool lies in memory it mapped or registered (never Go memory, which the garbage
	// collector may move and UCX must never be handed).
	Direct(pool []byte) bool
	// PostSendIOV sends the concatenation of iov as the message tagged tag. The transport
	// may read the slices until the operation's final completion.
	PostSendIOV(to Peer, tag Tag, iov [][]byte, done func(Completion)) (OpID, error)
	// PostRecvIOV receives the message tagged tag, scattered over iov in order. The
	// transport may write the slices until the operation's final completion. A message
	// longer than the slices together fails the receive.
	PostRecvIOV(from Peer, tag Tag, iov [][]byte, done func(Completion)) (OpID, error)
}

// RMATransport is an optional extension of DirectTransport for the direct path's RMA mode:
// the receiver reads the sender's blocks with RMA gets, pool range to pool range, instead of
// taking one tagged IOV message per chunk. On UCX 1.13 a rendezvous of an IOV datatype falls
// back to a two-copy pipeline, while a get of a contiguous range between pools UCX mapped is
// one copy (cma's process_vm_readv, or a memcpy from the peer's attached shared memory).
//
// The receiver drives it, because then it writes only its own memory and knows when that is
// quiet: when every get has its final completion, as for any operation. The sender's pool is
// read, not written; the sender keeps it exposed (its blocks "busy") until the receiver says
// it is done (Done or KindRMARelease) or the transport reports the peer lost, which for
// every Transport means the peer can no longer reach this side's memory.
type RMATransport interface {
	DirectTransport
	// RMAKey describes pool, which Direct accepted, for a peer's gets: the address that names
	// pool[0] in PostGet, and the packed remote key of the region holding it. A transport
	// packs a region's key once and returns the same bytes every time.
	RMAKey(pool []byte) (addr uint64, key []byte, err error)
	// PostGet reads len(dst) bytes of peer from's memory at addr (inside the pool its RMAKey
	// described with key) into dst, which lies in a pool Direct accepted. The transport may
	// write dst until the operation's final completion. tag names the operation for logs
	// and fault injection only. A get in flight cannot be stopped: Cancel reports MemoryBusy
	// and the final verdict follows when it completes or its endpoint is force-closed.
	PostGet(from Peer, tag Tag, key []byte, addr uint64, dst []byte, done func(Completion)) (OpID, error)
}

// RMAEmulation is an optional extension of RMATransport, for a transport that can tell per peer
// whether its gets are served by the transport itself (one copy: shared memory, cma, RDMA) or
// emulated (UCX 1.13 over TCP turns each get into active messages the peer's worker answers,
// which is no faster than tagged messages and leaves the sender's pool exposed for nothing).
// An engine takes the RMA mode where gets are emulated only when its configuration asks for it
// (transfer.Config.Tuning.RMAWhereEmulated).
type RMAEmulation interface {
	RMATransport
	// GetsEmulated reports whether gets from peer would be emulated. It decides by what the
	// transport knows of its connection to peer (UCX: the endpoint's lanes), may wait a
	// bounded time for it, and answers false when it cannot tell.
	GetsEmulated(peer Peer) bool
}

// RMAKeyPreparer is an optional extension of RMATransport, for a transport that unpacks a
// peer's key once per worker. PrepareKeys unpacks the offer's pool key on every worker that
// gets from peer from will run on, before the first get: a receiver calls it as soon as it
// accepts an offer, while the sender has just shown itself alive. UCX 1.13 crashes the
// process when a key of shared memory is first unpacked after its peer died; unpacked at each
// lane's first get instead, a key met that window for as long as the lanes took to start.
type RMAKeyPreparer interface {
	PrepareKeys(from Peer, poolKey []byte) error
}

// RMAMapper is an optional extension of RMATransport, for a transport that can show a peer's
// memory in this process (UCX's shared memory maps the segment of memory UCX allocated for the
// peer: ucp_rkey_ptr). A reader then loads the bytes itself instead of posting a get: one copy
// fewer where the reader copies them on anyway (the staging path's scatter, straight out of
// the sender's slot).
type RMAMapper interface {
	// MapRemote returns bytes [addr, addr+n) of peer from's memory named by key (as the peer's
	// RMAKey gave it) as a slice of this process's memory, and release, which ends the use
	// (once; later calls do nothing). Until release the view stays readable, whatever becomes
	// of the peer. It returns a nil view and no error where the memory is not mapped here
	// (the caller gets instead). The caller bounds [addr, addr+n) by what the peer named; the
	// UCX transport also refuses a range outside the memory the key names (ErrProtocol,
	// docs/security.md), but a transport need not.
	MapRemote(from Peer, key []byte, addr uint64, n int) (view []byte, release func(), err error)
}

// RMALanes is an optional extension of RMATransport, for a transport that spreads gets over
// several lanes that copy in parallel (the UCX transport's lanes). A receiver then cuts a request too
// small to give every lane two gets of DirectChunkBytes into smaller gets, so that it uses them
// all.
type RMALanes interface {
	RMATransport
	// GetLanes is how many lanes the gets are spread over. It never blocks.
	GetLanes() int
}

// RMAGenerations is an optional extension of RMATransport that makes the RMA mode's reads
// validated. The rule, which both engines keep:
//
//  1. The sender gives each exposure a generation word (ExposeGeneration) and names it in its
//     offer, with the value it holds.
//  2. Before the exposed blocks may be reused or released (the exposure ends, for whatever
//     reason: the receiver's Done or release, its decline, or a report that it is lost) the
//     sender ends the generation: the word changes, for good, to a value no exposure has.
//  3. The receiver, after every data get has completed, reads the word with a fence in
//     between (PostReadGeneration) and completes only if it still holds the offered value.
//     Otherwise the transfer fails with an ErrStaleRead and nothing completes.
//
// A get that read a block after the sender let it go therefore always precedes a read of the
// changed word: a receiver the sender believed gone (a keepalive false alarm, a worker that
// was replaced) can no longer complete with bytes that changed under it. The UCX and in-memory
// transports implement it. A sender whose transport does not offers unvalidated reads; a
// receiver whose transport does not declines a validated offer, and the transfer runs on IOV
// messages instead.
type RMAGenerations interface {
	// ExposeGeneration gives one exposure a generation word that peers can read: its
	// address, the packed remote key of the region holding it, and its value, which no other
	// exposure of this transport ever had. end changes the word to a value no exposure has
	// and frees it for another exposure; it must run before the exposed blocks are reused or
	// released, and runs once.
	ExposeGeneration() (addr uint64, key []byte, value uint64, end func(), err error)
	// PrepareReadGeneration readies a later PostReadGeneration from peer from with key (UCX
	// unpacks the key now, while the peer is known to answer, as it does the pool's key at the
	// first get). The receiver calls it when it accepts a validated offer.
	PrepareReadGeneration(from Peer, key []byte) error
	// PostReadGeneration reads the 8-byte generation word at addr of peer from (key as the
	// peer's ExposeGeneration gave it) after every get this transport posted to from before
	// it, with a fence in between, and reports the word's value with the operation's final
	// completion. The callback rules of Transport hold.
	PostReadGeneration(from Peer, tag Tag, key []byte, addr uint64, done func(c Completion, value uint64)) (OpID, error)
}

// GenerationWords is an optional extension of RMAGenerations: how many generation words the
// transport has, and how many exposures hold one now. When none is free ExposeGeneration fails
// with ErrNoGenerationWord, and the engine's Health says so.
type GenerationWords interface {
	// GenerationWords reports the words held and the words in all. It never blocks for long.
	GenerationWords() (held, total int)
}

// PoolHolder is an optional extension of Transport for pools the caller registered with the
// transport and may unregister (the UCX transport's regions). The engine holds a Spec's pool from
// the start of the transfer until its Quiesced channel closes, so the transport can refuse to
// unregister memory a transfer, or a peer reading it, may still touch. A transfer whose
// blocks are poisoned for good never lets go.
type PoolHolder interface {
	// HoldPool marks pool as used by one transfer and returns the call that ends the use, or
	// nil when pool is not memory the caller can unregister. It never blocks for long.
	HoldPool(pool []byte) (release func())
}

// PeerConnectReporter is implemented by the Inbound the engine binds to its transport. A
// transport that knows when it reaches a peer (UCX, on endpoint creation and on reconnect)
// reports it through a type assertion on its Inbound:
//
//	if r, ok := in.(transport.PeerConnectReporter); ok {
//		r.OnPeerConnected(peer)
//	}
//
// so Inbound itself, which every transport implements against, does not change. Same rules as
// Inbound's methods: called from the transport's goroutine, never from inside a Transport
// method the engine is calling, and it does not block.
type PeerConnectReporter interface {
	OnPeerConnected(peer Peer)
}

// LargeSegmentSender is a transport whose messages may reach a peer in pieces larger than a
// transport of the same kind receives by default (UCX's TCP transport, sending segments above
// UCX's default 64 KiB receive buffer: ucx.Config.TCPSegmentBytes). A receiver that cannot take
// them reads past its buffer or aborts, so the engine sends data only to a peer whose hello
// says it takes them (the large-segments feature) and refuses the rest with a
// transfer.ErrPeerLacksFeature before anything is sent.
type LargeSegmentSender interface {
	SendsLargeSegments() bool
}

// PeerCloser is a transport that can close its connection to one peer while it keeps serving
// the others. The engine asks for it when a departing peer's goodbye (docs/protocol.md) has
// ended every transfer this engine had with it: on UCX a send whose peer left without
// matching it stays on the endpoint, busy, until the endpoint closes, so closing it is what
// gives those operations their final verdict. Every outstanding operation with the peer then
// reports as under Close(true): MemoryDone where the transport proves it let go, else
// MemoryUnknown (or, where the transport cannot tell yet, MemoryBusy until it can). A later
// operation with the peer connects again. ClosePeer never blocks and never calls back inside
// the call.
type PeerCloser interface {
	ClosePeer(peer Peer)
}

// Params is a request's description for the receiver that will claim it, as a transport
// writes it (the UCX transport's *ucx.ContextParams): encoded with MarshalBinary and handed
// over by the caller's control plane, sealed and checked with the cluster keys.
type Params interface {
	MarshalBinary() ([]byte, error)
	Sign(keys [][]byte) error
	Verify(keys [][]byte) error
}

// Exposure is what a receiver needs to read a request's blocks at once with gets, with no
// request/offer round trip (docs/protocol.md, "One-hop reads"): what it would otherwise learn
// from the sender's RMA offer. A transport's params carry it (the UCX ContextParams' Exposure
// section). Everything in it is the sender's word: the params' decoder checks its bounds, and
// the receiver checks each key (native.CheckRemoteKey) before it is unpacked and each read
// against Regions.
type Exposure struct {
	// Addr is the address in the sender of its pool's first byte (layout offset 0), as Key
	// names it.
	Addr uint64
	// Key is the packed remote key of the sender's pool (its RMA registration).
	Key []byte
	// Regions are the ranges (address, bytes) of the pool a receiver may read: sorted,
	// disjoint, each inside [Addr, Addr + the layout's span).
	Regions [][2]uint64
	// GenAddr, GenKey and Generation name the exposure's generation word (the packed key of
	// the region holding it) and the value it holds while the blocks are exposed: the
	// receiver reads it after its last get, and a read that raced a reuse is refused.
	GenAddr    uint64
	GenKey     []byte
	Generation uint64
}

// ParamsIssuer is an optional extension of Transport whose requests are handed over as a
// blob (the UCX transport): Engine.Expose asks it for the params of a request it exposes
// without naming its receiver (docs/protocol.md, "Exposure without a named receiver").
type ParamsIssuer interface {
	// ExposeParams describes request id over plan (the sender's blocks) with its secret, for
	// any receiver: the params name this transport as the sender, carry secret and say that
	// no receiver is named, and carry exposure when it is not nil (a one-hop read's section).
	// Nothing is sealed yet.
	ExposeParams(id RequestID, plan *layout.Plan, secret []byte, exposure *Exposure) (Params, error)
}
