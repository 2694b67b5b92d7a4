// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/buffer"
	"github.com/kvxfer/kvxfer/internal/transferdefaults"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"go.uber.org/zap"
)

// Config tunes an Engine. Zero values take the defaults documented on each field (a few also
// listed as Default* constants); the budgets and MaxRetries, whose zero is a setting of its own, take
// None for zero. New validates the result once and names the first field that cannot work.
type Config struct {
	// SlotBytes is the size of one staging slot, header included: a chunk carries
	// SlotBytes-transport.DataHeaderBytes bytes of KV. Peers must agree (the receiver's chunk size must
	// fit the sender's slots). Default 4 MiB.
	SlotBytes int64
	// MaxConcurrent is the most sub-transfers past Queued at once (advertised, in flight, or
	// quarantined while their goroutine still waits on the transport), whether they hold
	// staging slots or take the one-copy path and hold none; more wait queued, bounded by
	// QueueTimeout (a Send only once its receiver's request came). Default 64.
	MaxConcurrent int
	// PipelineDepth is the most slots one transfer holds, so chunk i+1 is gathered while
	// chunk i is on the wire. A transfer needs only one to progress; the others are taken
	// only when free. Default 2.
	PipelineDepth int
	// NumSlots is the number of staging slots. It must be at least MaxConcurrent (L13).
	// Default MaxConcurrent*PipelineDepth.
	NumSlots int
	// StagingMemory backs the slots (registered memory, say). If nil, New allocates
	// NumSlots*SlotBytes bytes. If set, NumSlots defaults to len/SlotBytes.
	StagingMemory []byte
	// TransferTimeout is a transfer's deadline, counted from its first slot lease, when its
	// Spec gives none. Default 30s.
	TransferTimeout time.Duration
	// QueueTimeout bounds how long a transfer waits queued (for a slot; on the receiving side
	// for the peer's hello, the first time it meets the peer; on the sending side for the
	// receiver's request) when the Send/Receive context has no earlier deadline. Default 30s.
	QueueTimeout time.Duration
	// ExposureTimeout bounds how long an exposure (Engine.Expose) waits to be claimed: one
	// nobody claimed by then ends Failed, its blocks free at once. Default 60s.
	ExposureTimeout time.Duration
	// ProgressDeadline: Health turns unhealthy when no byte has moved and no transfer has
	// completed for this long while transfers were asked for: in flight, or failing one
	// after another, active or still queued (a request that starts less than this after the
	// last one ended keeps the clock running). Default 10s.
	ProgressDeadline time.Duration
	// QuarantineBudget: Health turns unhealthy when more transfers than this wait in
	// quarantine at once (those quarantined for good with their caller's blocks poisoned are
	// bounded by PoisonedBlockBudget instead). Default 8; None tolerates none.
	QuarantineBudget int
	// PoisonedBlockBudget: Health turns unhealthy when more of the callers' KV blocks than
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
	// Send or Receive with it fails at once (a *PeerLostError matching ErrPeerLost) instead
	// of waiting out QueueTimeout for a peer that is gone. A message from the peer ends it
	// sooner (a false alarm). At most MaxPending peers are remembered. Default 30s.
	LostPeerTTL time.Duration
	// CloseTimeout bounds Engine.Close, the transport's own close aside (it has its own bound,
	// ucx.Config.CloseTimeout), and Drain when its context has no deadline. Close splits it so
	// that no step eats another's share: stopping the transfers (CancelGrace, the settle before
	// the goodbye, the goodbye, the copies running) takes at most three quarters of it; after
	// the transport's close, the transfers' last verdicts and the Observer's hearing every
	// event (every Done closed) take the rest, at least a quarter. Default 10s.
	CloseTimeout time.Duration
	// ReadyPollInterval is how often a streaming Send polls its Spec.Ready signals while it
	// waits on them (never blocking on one). Default 100us: a layer of prefill takes
	// milliseconds, so the poll adds little delay and little CPU.
	ReadyPollInterval time.Duration
	// DisableDirect forces every transfer through staging slots. By default a transfer takes
	// the one-copy (direct) path when the transport implements transport.DirectTransport, both sides'
	// pools are direct-capable (Transport.Direct), the spec has no Mover, and the receiver
	// asks for it: the transport then reads and writes the caller's pool in place, and no
	// slot is leased. Set it on the receiver to make a pair use staging (the receiver decides;
	// a sender's own setting refuses a direct request it gets).
	DisableDirect bool
	// DirectChunkBytes is the most stream bytes one direct message carries. No slot bounds
	// it, so it is large: fewer messages cost less per byte, and PipelineDepth of them are
	// posted at once. Default 64 MiB.
	DirectChunkBytes int64
	// DisableRMA keeps the direct path on tagged IOV messages. By default, when the transport
	// implements transport.RMATransport, a direct receiver asks the sender for its pool (FlagRMA) and
	// reads the blocks with RMA gets, pool range to pool range, whenever the two layouts line
	// up (see RMAMinRegionBytes); a sender with DisableRMA declines such a request. See
	// docs/onecopy.md.
	DisableRMA bool
	// noOneHop keeps an exposure's params without the Exposure section and a Receive from
	// reading one (onehop.go): the request/offer round trip, as before one-hop reads. For tests
	// and measurements.
	noOneHop bool
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
	// fewer; only a Spec without a Mover, or with a Mover that says it may
	// (AnySourceScatterer: HostMover does), reads in place.
	DisableInPlaceReads bool
	// RMAWhereEmulated keeps the RMA mode where the transport says its gets to the peer are
	// emulated (transport.RMAEmulation: UCX 1.13 over TCP). By default such a receiver takes the direct
	// path's tagged messages instead, and Handle.Path says PathDirect; on the staging path it
	// keeps the data messages instead of the pull wire.
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
	// run: Plan.RunUnits rows) for which a receiver takes the direct path: below it (a
	// token-major layout such as layer-major-nhd, whose pieces are one row of one head) each
	// piece would be an IOV entry of its own, and staging's gather and scatter move such pieces
	// faster than UCX does (measured on UCX 1.13 shared memory: 256-byte pieces 0.7 against 1.5
	// GB/s, 1 KiB 0.6 against 1.1, 4 KiB 1.9 against 1.3; docs/benchmarks.md). Only this
	// side's layout counts: the receiver does not know the sender's. Default 2 KiB; None
	// takes the direct path whatever the pieces.
	DirectMinRunBytes int64
	// ClusterKeys, when set, authenticate the hello handshake (docs/protocol.md, "The cluster
	// key"): each key is ClusterKeyBytes random bytes; the first seals every hello, hello
	// challenge and proof this engine sends, and any one opens those it gets. A message not
	// sealed by a key it holds (an engine without keys, of wire 3, another fleet's, or forged)
	// is dropped before it is answered, counted (TrustObserver.OnAuthRefused,
	// kvxfer_auth_refused_total), and changes nothing, so transfers with such a peer end at
	// their queued deadline. The same keys sign and check ContextParams (Engine.SignParams,
	// Engine.VerifyParams; "params" in the metric). Every engine of a fleet must hold a key
	// before any one sets them;
	// to rotate, add the new key second everywhere, then move it first, then drop the old.
	// Default none: hellos are proven by their challenge alone.
	ClusterKeys [][]byte
	// RequireClaimProof: a Send with a Spec.Secret takes a request only with a valid claim
	// proof of that secret even without cluster keys (with keys, it always does). A receiver
	// that sends none (one without the secret, or of an earlier build) is refused
	// (docs/protocol.md, "ContextParams v3"). Default false: without keys, a Send takes a
	// request from its named peer as it always has.
	RequireClaimProof bool
	// Logger receives lifecycle events. Default zap.NewNop().
	Logger *zap.Logger
	// Observer hears every transition, cancel, quarantine, poison and progress. Default
	// NopObserver.
	Observer Observer
}

// None sets a Config count whose zero value takes a default (QuarantineBudget,
// PoisonedBlockBudget, MaxRetries) to zero.
const None = -1

// Defaults of Config that the module's tools size against too (internal/transferdefaults);
// each is documented on its field.
const (
	defaultSlotBytes        = transferdefaults.SlotBytes
	defaultDirectChunkBytes = transferdefaults.DirectChunkBytes
	defaultMaxConcurrent    = transferdefaults.MaxConcurrent
	defaultPipelineDepth    = transferdefaults.PipelineDepth
	defaultProgressDeadline = transferdefaults.ProgressDeadline
	defaultQuarantineBudget = transferdefaults.QuarantineBudget
	defaultPoisonedBlocks   = transferdefaults.PoisonedBlocks
	defaultCancelGrace      = transferdefaults.CancelGrace
)

// The other defaults of Config, each documented on its field.
const (
	defaultRMAMinRegionBytes = 256 << 10
	defaultInPlaceMinRegion  = 4 << 10
	defaultDirectMinRunBytes = 2 << 10
	defaultTransferTimeout   = 30 * time.Second
	defaultQueueTimeout      = 30 * time.Second
	defaultExposureTimeout   = 60 * time.Second
	defaultQuarantineTimeout = 10 * time.Second
	defaultRetryInterval     = 200 * time.Millisecond
	defaultMaxRetries        = 6
	defaultMaxPending        = 4096
	defaultPendingTTL        = 30 * time.Second
	defaultLostPeerTTL       = 30 * time.Second
	defaultCloseTimeout      = 10 * time.Second
	defaultReadyPollInterval = 100 * time.Microsecond
)

func (c Config) withDefaults() Config {
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	defInt := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defCount := func(v *int, d int) { // zero is a setting: None asks for it
		switch *v {
		case 0:
			*v = d
		case None:
			*v = 0
		}
	}
	if c.SlotBytes == 0 {
		c.SlotBytes = defaultSlotBytes
	}
	defInt(&c.MaxConcurrent, defaultMaxConcurrent)
	if c.DirectChunkBytes == 0 {
		c.DirectChunkBytes = defaultDirectChunkBytes
	}
	if c.RMAMinRegionBytes == 0 {
		c.RMAMinRegionBytes = defaultRMAMinRegionBytes
	}
	if c.InPlaceMinRegionBytes == 0 {
		c.InPlaceMinRegionBytes = defaultInPlaceMinRegion
	}
	if c.DirectMinRunBytes == 0 { // None stays: no bound (withDefaults may run twice)
		c.DirectMinRunBytes = defaultDirectMinRunBytes
	}
	defInt(&c.PipelineDepth, defaultPipelineDepth)
	if c.NumSlots == 0 && c.SlotBytes > 0 {
		if c.StagingMemory != nil {
			c.NumSlots = int(int64(len(c.StagingMemory)) / c.SlotBytes)
		} else {
			c.NumSlots = c.MaxConcurrent * c.PipelineDepth
		}
	}
	def(&c.TransferTimeout, defaultTransferTimeout)
	def(&c.QueueTimeout, defaultQueueTimeout)
	def(&c.ExposureTimeout, defaultExposureTimeout)
	def(&c.ProgressDeadline, defaultProgressDeadline)
	defCount(&c.QuarantineBudget, defaultQuarantineBudget)
	defCount(&c.PoisonedBlockBudget, defaultPoisonedBlocks)
	def(&c.QuarantineTimeout, defaultQuarantineTimeout)
	def(&c.CancelGrace, defaultCancelGrace)
	def(&c.RetryInterval, defaultRetryInterval)
	defCount(&c.MaxRetries, defaultMaxRetries)
	defInt(&c.MaxPending, defaultMaxPending)
	def(&c.PendingTTL, defaultPendingTTL)
	def(&c.LostPeerTTL, defaultLostPeerTTL)
	def(&c.CloseTimeout, defaultCloseTimeout)
	def(&c.ReadyPollInterval, defaultReadyPollInterval)
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Observer == nil {
		c.Observer = NopObserver{}
	}
	return c
}

func (c Config) validate() error {
	bad := func(field string, v any, reason string) error {
		return &ConfigError{Field: field, Value: v, Reason: reason}
	}
	switch {
	case c.SlotBytes <= wire.DataHeaderBytes:
		return bad("SlotBytes", c.SlotBytes, fmt.Sprintf("must exceed the %d-byte chunk header", wire.DataHeaderBytes))
	case c.DirectChunkBytes < 8 || c.DirectChunkBytes > 1<<40:
		return bad("DirectChunkBytes", c.DirectChunkBytes, "must be in [8, 2^40]")
	case c.DirectMinRunBytes < None:
		return bad("DirectMinRunBytes", c.DirectMinRunBytes, "must not be negative (None, -1, sets no bound)")
	case c.RMAMinRegionBytes < 1:
		return bad("RMAMinRegionBytes", c.RMAMinRegionBytes, "must be at least 1 byte")
	case c.InPlaceMinRegionBytes < 1:
		return bad("InPlaceMinRegionBytes", c.InPlaceMinRegionBytes, "must be at least 1 byte")
	case c.MaxConcurrent < 1:
		return bad("MaxConcurrent", c.MaxConcurrent, "must be at least 1")
	case c.PipelineDepth < 1:
		return bad("PipelineDepth", c.PipelineDepth, "must be at least 1")
	case c.NumSlots < 1:
		return bad("NumSlots", c.NumSlots, "must be at least 1")
	case c.NumSlots < c.MaxConcurrent:
		// Said here, in this Config's fields (and the UCX transport's, which sizes
		// StagingMemory), before the staging pool would say it in its own.
		from := "NumSlots"
		if c.StagingMemory != nil {
			from = fmt.Sprintf("StagingMemory's %d bytes (ucx.Config.StagingBytes sizes the UCX transport's)", len(c.StagingMemory))
		}
		return &ConfigError{Field: "NumSlots", Value: c.NumSlots, Cause: buffer.ErrUndersized, Reason: fmt.Sprintf(
			"%d staging slots of SlotBytes = %d (from %s), but MaxConcurrent = %d needs at least %d slots: each transfer "+
				"past Queued holds one (L13); give more StagingMemory (ucx.Config.StagingBytes), shrink SlotBytes, or lower MaxConcurrent",
			c.NumSlots, c.SlotBytes, from, c.MaxConcurrent, c.MaxConcurrent)}
	case c.StagingMemory != nil && int64(len(c.StagingMemory)) < int64(c.NumSlots)*c.SlotBytes:
		return bad("StagingMemory", len(c.StagingMemory), fmt.Sprintf("holds fewer than NumSlots*SlotBytes = %d bytes", int64(c.NumSlots)*c.SlotBytes))
	case c.QuarantineBudget < 0:
		return bad("QuarantineBudget", c.QuarantineBudget, "must not be negative (None, -1, sets zero)")
	case c.PoisonedBlockBudget < 0:
		return bad("PoisonedBlockBudget", c.PoisonedBlockBudget, "must not be negative (None, -1, sets zero)")
	case c.MaxRetries < 0:
		return bad("MaxRetries", c.MaxRetries, "must not be negative (None, -1, sets zero)")
	case c.MaxPending < 0:
		return bad("MaxPending", c.MaxPending, "must not be negative")
	}
	seen := map[string]int{}
	for i, k := range c.ClusterKeys { // the value named is the length: key bytes are never printed
		field := fmt.Sprintf("ClusterKeys[%d]", i)
		if len(k) != ClusterKeyBytes {
			return bad(field, len(k), fmt.Sprintf("a key of %d bytes: want %d random bytes", len(k), ClusterKeyBytes))
		}
		if j, ok := seen[string(k)]; ok {
			return bad(field, len(k), fmt.Sprintf("repeats ClusterKeys[%d]", j))
		}
		seen[string(k)] = i
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"TransferTimeout", c.TransferTimeout}, {"QueueTimeout", c.QueueTimeout}, {"ExposureTimeout", c.ExposureTimeout},
		{"ProgressDeadline", c.ProgressDeadline}, {"QuarantineTimeout", c.QuarantineTimeout},
		{"CancelGrace", c.CancelGrace}, {"RetryInterval", c.RetryInterval}, {"PendingTTL", c.PendingTTL},
		{"LostPeerTTL", c.LostPeerTTL}, {"CloseTimeout", c.CloseTimeout}, {"ReadyPollInterval", c.ReadyPollInterval},
	} {
		if d.v < 0 {
			return bad(d.name, d.v, "must be positive")
		}
	}
	return nil
}
