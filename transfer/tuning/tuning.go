// SPDX-License-Identifier: Apache-2.0

package tuning

import "time"

// Config is transfer.Config.Tuning. Zero values take the defaults documented on each field;
// the budgets and MaxRetries, whose zero is a setting of its own, take None for zero.
// transfer.New validates them with the rest of the Config and names a wrong one as
// "Tuning.<field>".
type Config struct {
	// PipelineDepth is the most slots one transfer holds, so chunk i+1 is gathered while
	// chunk i is on the wire. A transfer needs only one to progress; the others are taken
	// only when free. Default 2.
	PipelineDepth int
	// NumSlots is the number of staging slots. It must be at least transfer.Config.MaxConcurrent
	// (L13). Default MaxConcurrent*PipelineDepth, or, with Config.StagingMemory, as many slots of
	// Config.SlotBytes as it holds.
	NumSlots int
	// QuarantineBudget: Engine.Health turns unhealthy when more transfers than this wait in
	// quarantine at once (those quarantined for good with their caller's blocks poisoned are
	// bounded by PoisonedBlockBudget instead). Default 8; None tolerates none.
	QuarantineBudget int
	// PoisonedBlockBudget: Engine.Health turns unhealthy when more of the callers' KV blocks than
	// this are poisoned for good (a one-copy operation never said whether it let go of them:
	// they are never to be used again, and the engine refuses transfers over them). It never
	// recovers without a restart. Default 1024; None tolerates none.
	PoisonedBlockBudget int
	// QuarantineTimeout is how long a quarantined transfer waits for the transport to prove
	// it is done with a slot before the slot is poisoned. Default 10s.
	QuarantineTimeout time.Duration
	// CancelGrace is how long a cancelled in-flight transfer waits for its operations to
	// stop before it is quarantined. Default 100ms.
	CancelGrace time.Duration
	// RetryInterval is the first wait before the receiver resends its request to a sender
	// that has not answered; it doubles on each retry. Default 200ms.
	RetryInterval time.Duration
	// MaxRetries bounds those resends. Default 6; None sends the request once.
	MaxRetries int
	// MaxPending bounds the requests kept for Sends not made yet, and the peers whose hellos
	// the engine remembers (with the challenge outstanding for each: docs/protocol.md, "The
	// hello handshake"); past it, peers no transfer waits on are forgotten, and met again.
	// Default 4096.
	MaxPending int
	// PendingTTL is how long such a request is kept, and how long a hello challenge stays
	// outstanding before a new one replaces it. It also bounds how long the engine keeps a
	// connection it made only to answer a hello or challenge whose sender never proved itself
	// (docs/security.md, "Hellos"). Default 30s.
	PendingTTL time.Duration
	// LostPeerTTL is how long the engine remembers a peer its transport reported lost: a
	// Send or Receive with it fails at once (a *transfer.PeerLostError matching ErrPeerLost)
	// instead of waiting out Config.QueueTimeout for a peer that is gone. A message from the peer ends it
	// sooner (a false alarm). At most MaxPending peers are remembered. Default 30s.
	LostPeerTTL time.Duration
	// ReadyPollInterval is how often a streaming Send polls its transfer.Spec.Ready signals while it
	// waits on them (never blocking on one). Default 100us: a layer of prefill takes
	// milliseconds, so the poll adds little delay and little CPU.
	ReadyPollInterval time.Duration
	// DisableDirect forces every transfer through staging slots. By default a transfer takes
	// the one-copy (direct) path when the transport implements transport.DirectTransport, both sides'
	// pools are direct-capable (transport.Transport.Direct), the spec has no Mover, and the receiver
	// asks for it: the transport then reads and writes the caller's pool in place, and no
	// slot is leased. Set it on the receiver to make a pair use staging (the receiver decides;
	// a sender's own setting refuses a direct request it gets).
	DisableDirect bool
	// DirectChunkBytes is the most stream bytes one direct message carries. No slot bounds
	// it, so it is large: fewer messages cost less per byte, and PipelineDepth of them are
	// posted at once. Default 64 MiB.
	DirectChunkBytes int64
	// DisableRMA keeps the direct path on tagged IOV messages. By default, when the transport
	// implements transport.RMATransport, a direct receiver asks the sender for its pool (docs/onecopy.md) and
	// reads the blocks with RMA gets, pool range to pool range, whenever the two layouts line
	// up (see RMAMinRegionBytes); a sender with DisableRMA declines such a request. See
	// docs/onecopy.md.
	DisableRMA bool
	// DisablePull keeps the staging path on tagged data messages. By default, when both
	// engines' transports implement transport.RMATransport and map their staging memory (ucx.Transport's
	// StagingMemory), and gets to the peer are not emulated, the receiver reads each chunk out
	// of the sender's slot with a get (the pull wire, docs/staging.md): over UCX 1.13 shared
	// memory a tagged message is copied through the receiver's FIFO in 8 KiB pieces, a get
	// from mapped memory is one memcpy. A sender with DisablePull declines, and the chunks go
	// as messages.
	DisablePull bool
	// DisableInPlaceReads makes a pull receiver read each chunk with a get into a slot of its
	// own even where its transport maps the sender's slots into this process (transport.RMAMapper: UCX
	// over shared memory). By default the scatter then reads the chunk in place, one copy
	// fewer; only a Spec without a Mover (the engine's own host mover reads
	// any host memory) reads in place. On UCX 1.22 over shared memory those gets are UCX's
	// emulation, served by the sender's worker, which UCX's defect may crash if this process is
	// lost with replies queued to it (docs/ucx.md, "UCX purges the replies to a peer's emulated
	// gets with a stale datatype"): leave it off there.
	DisableInPlaceReads bool
	// RMAWhereEmulated keeps the RMA mode where the transport says its gets to the peer are
	// emulated (transport.RMAEmulation: UCX 1.13 over TCP). By default such a receiver takes the direct
	// path's tagged messages instead, and transfer.Handle.Path says PathDirect; on the staging path it
	// keeps the data messages instead of the pull wire. A UCX transport over TCP only serves
	// no RMA unless its ucx.Config.ServeEmulatedRMA is set (docs/security.md); transfer.New
	// refuses this setting over a transport that serves none.
	RMAWhereEmulated bool
	// RMAMinRegionBytes is the smallest mean size of the pool-to-pool ranges (each as long as
	// both sides' bytes stay contiguous) for which a receiver takes the RMA mode: below it
	// (layout conversion, heterogeneous TP) every range would be a get of its own, and the IOV
	// message does better. Default 256 KiB; a block-major pool moving whole blocks has ranges
	// of at least one block.
	RMAMinRegionBytes int64
	// InPlaceMinRegionBytes replaces RMAMinRegionBytes where the receiver reads the offered
	// pool in place (transport.RMAMapper: UCX shared memory, docs/onecopy.md "Reads in place"): each range
	// is then a copy call, not a get, and layout conversion and heterogeneous TP take the RMA
	// mode down to ranges of this mean size (or RMAMinRegionBytes, if smaller). Default 4 KiB.
	InPlaceMinRegionBytes int64
	// DirectMinRunBytes is the smallest contiguous piece of the receiver's pool (its plan's
	// run: kvplan.RunUnits rows, internal/kvplan) for which a receiver takes the direct path: below it (a
	// token-major layout such as layer-major-nhd, whose pieces are one row of one head) each
	// piece would be an IOV entry of its own, and staging's gather and scatter move such pieces
	// faster than UCX does (measured on UCX 1.13 shared memory: 256-byte pieces 0.7 against 1.5
	// GB/s, 1 KiB 0.6 against 1.1, 4 KiB 1.9 against 1.3; docs/benchmarks.md). Only this
	// side's layout counts: the receiver does not know the sender's. Default 2 KiB; None
	// takes the direct path whatever the pieces.
	DirectMinRunBytes int64
}

// None sets a count whose zero value takes a default (QuarantineBudget, PoisonedBlockBudget,
// MaxRetries) to zero, and DirectMinRunBytes to no bound.
const None = -1
