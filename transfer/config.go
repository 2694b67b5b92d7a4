// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/buffer"
	"github.com/kvxfer/kvxfer/internal/transferdefaults"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/tuning"
	"go.uber.org/zap"
)

// Config sets up an Engine. Zero values take the defaults documented on each field; New
// validates the result once and names the first field that cannot work.
//
// The fields here are what a serving program decides: the staging slots' size and memory,
// how many transfers run at once, the deadlines, the cluster keys, where logs and events go.
// Everything else (the path thresholds and switches, the pipeline depth, the health budgets,
// the protocol's retry and memory bounds) is in Tuning, package transfer/tuning, whose
// defaults suit a serving program: set it to pin a path for a measurement or after measuring
// that a default does not fit.
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
	// StagingMemory backs the slots (registered memory, say). If nil, New allocates
	// Tuning.NumSlots*SlotBytes bytes. If set, Tuning.NumSlots defaults to len/SlotBytes.
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
	// CloseTimeout bounds Engine.Close, the transport's own close aside (it has its own bound,
	// ucx.Config.CloseTimeout), and Drain when its context has no deadline. Close splits it so
	// that no step eats another's share: stopping the transfers (Tuning.CancelGrace, the settle before
	// the goodbye, the goodbye, the copies running) takes at most three quarters of it; after
	// the transport's close, the transfers' last verdicts and the Observer's hearing every
	// event (every Done closed) take the rest, at least a quarter. Default 10s.
	CloseTimeout time.Duration
	// noOneHop keeps an exposure's params without the Exposure section and a Receive from
	// reading one (onehop.go): the request/offer round trip, as before one-hop reads. For tests
	// and measurements.
	noOneHop bool
	// ClusterKeys, when set, authenticate the hello handshake (docs/protocol.md, "The cluster
	// key"): each key is ClusterKeyBytes random bytes; the first seals every hello, hello
	// challenge and proof this engine sends, and any one opens those it gets. A message not
	// sealed by a key it holds (an engine without keys, of wire 3, another fleet's, or forged)
	// is dropped before it is answered, counted (an Observer's OnAuthRefused,
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
	// Observer hears every transition, cancel, quarantine, poison and progress. Default: none.
	Observer Observer
	// Tuning holds the knobs a serving program leaves at their defaults (package
	// transfer/tuning).
	Tuning tuning.Config
}

// none is tuning.None: zero for a count whose zero value takes a default.
const none = tuning.None

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
		case none:
			*v = 0
		}
	}
	if c.SlotBytes == 0 {
		c.SlotBytes = defaultSlotBytes
	}
	defInt(&c.MaxConcurrent, defaultMaxConcurrent)
	if c.Tuning.DirectChunkBytes == 0 {
		c.Tuning.DirectChunkBytes = defaultDirectChunkBytes
	}
	if c.Tuning.RMAMinRegionBytes == 0 {
		c.Tuning.RMAMinRegionBytes = defaultRMAMinRegionBytes
	}
	if c.Tuning.InPlaceMinRegionBytes == 0 {
		c.Tuning.InPlaceMinRegionBytes = defaultInPlaceMinRegion
	}
	if c.Tuning.DirectMinRunBytes == 0 { // None stays: no bound (withDefaults may run twice)
		c.Tuning.DirectMinRunBytes = defaultDirectMinRunBytes
	}
	defInt(&c.Tuning.PipelineDepth, defaultPipelineDepth)
	if c.Tuning.NumSlots == 0 && c.SlotBytes > 0 {
		if c.StagingMemory != nil {
			c.Tuning.NumSlots = int(int64(len(c.StagingMemory)) / c.SlotBytes)
		} else {
			c.Tuning.NumSlots = c.MaxConcurrent * c.Tuning.PipelineDepth
		}
	}
	def(&c.TransferTimeout, defaultTransferTimeout)
	def(&c.QueueTimeout, defaultQueueTimeout)
	def(&c.ExposureTimeout, defaultExposureTimeout)
	def(&c.ProgressDeadline, defaultProgressDeadline)
	defCount(&c.Tuning.QuarantineBudget, defaultQuarantineBudget)
	defCount(&c.Tuning.PoisonedBlockBudget, defaultPoisonedBlocks)
	def(&c.Tuning.QuarantineTimeout, defaultQuarantineTimeout)
	def(&c.Tuning.CancelGrace, defaultCancelGrace)
	def(&c.Tuning.RetryInterval, defaultRetryInterval)
	defCount(&c.Tuning.MaxRetries, defaultMaxRetries)
	defInt(&c.Tuning.MaxPending, defaultMaxPending)
	def(&c.Tuning.PendingTTL, defaultPendingTTL)
	def(&c.Tuning.LostPeerTTL, defaultLostPeerTTL)
	def(&c.CloseTimeout, defaultCloseTimeout)
	def(&c.Tuning.ReadyPollInterval, defaultReadyPollInterval)
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
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
	case c.Tuning.DirectChunkBytes < 8 || c.Tuning.DirectChunkBytes > 1<<40:
		return bad("Tuning.DirectChunkBytes", c.Tuning.DirectChunkBytes, "must be in [8, 2^40]")
	case c.Tuning.DirectMinRunBytes < none:
		return bad("Tuning.DirectMinRunBytes", c.Tuning.DirectMinRunBytes, "must not be negative (None, -1, sets no bound)")
	case c.Tuning.RMAMinRegionBytes < 1:
		return bad("Tuning.RMAMinRegionBytes", c.Tuning.RMAMinRegionBytes, "must be at least 1 byte")
	case c.Tuning.InPlaceMinRegionBytes < 1:
		return bad("Tuning.InPlaceMinRegionBytes", c.Tuning.InPlaceMinRegionBytes, "must be at least 1 byte")
	case c.MaxConcurrent < 1:
		return bad("MaxConcurrent", c.MaxConcurrent, "must be at least 1")
	case c.Tuning.PipelineDepth < 1:
		return bad("Tuning.PipelineDepth", c.Tuning.PipelineDepth, "must be at least 1")
	case c.Tuning.NumSlots < 1:
		return bad("Tuning.NumSlots", c.Tuning.NumSlots, "must be at least 1")
	case c.Tuning.NumSlots < c.MaxConcurrent:
		// Said here, in this Config's fields (and the UCX transport's, which sizes
		// StagingMemory), before the staging pool would say it in its own.
		from := "Tuning.NumSlots"
		if c.StagingMemory != nil {
			from = fmt.Sprintf("StagingMemory's %d bytes (ucx.Config.StagingBytes sizes the UCX transport's)", len(c.StagingMemory))
		}
		return &ConfigError{Field: "Tuning.NumSlots", Value: c.Tuning.NumSlots, Cause: buffer.ErrUndersized, Reason: fmt.Sprintf(
			"%d staging slots of SlotBytes = %d (from %s), but MaxConcurrent = %d needs at least %d slots: each transfer "+
				"past Queued holds one (L13); give more StagingMemory (ucx.Config.StagingBytes), shrink SlotBytes, or lower MaxConcurrent",
			c.Tuning.NumSlots, c.SlotBytes, from, c.MaxConcurrent, c.MaxConcurrent)}
	case c.StagingMemory != nil && int64(len(c.StagingMemory)) < int64(c.Tuning.NumSlots)*c.SlotBytes:
		return bad("StagingMemory", len(c.StagingMemory), fmt.Sprintf("holds fewer than Tuning.NumSlots*SlotBytes = %d bytes", int64(c.Tuning.NumSlots)*c.SlotBytes))
	case c.Tuning.QuarantineBudget < 0:
		return bad("Tuning.QuarantineBudget", c.Tuning.QuarantineBudget, "must not be negative (None, -1, sets zero)")
	case c.Tuning.PoisonedBlockBudget < 0:
		return bad("Tuning.PoisonedBlockBudget", c.Tuning.PoisonedBlockBudget, "must not be negative (None, -1, sets zero)")
	case c.Tuning.MaxRetries < 0:
		return bad("Tuning.MaxRetries", c.Tuning.MaxRetries, "must not be negative (None, -1, sets zero)")
	case c.Tuning.MaxPending < 0:
		return bad("Tuning.MaxPending", c.Tuning.MaxPending, "must not be negative")
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
		{"ProgressDeadline", c.ProgressDeadline}, {"Tuning.QuarantineTimeout", c.Tuning.QuarantineTimeout},
		{"Tuning.CancelGrace", c.Tuning.CancelGrace}, {"Tuning.RetryInterval", c.Tuning.RetryInterval}, {"Tuning.PendingTTL", c.Tuning.PendingTTL},
		{"Tuning.LostPeerTTL", c.Tuning.LostPeerTTL}, {"CloseTimeout", c.CloseTimeout}, {"Tuning.ReadyPollInterval", c.Tuning.ReadyPollInterval},
	} {
		if d.v < 0 {
			return bad(d.name, d.v, "must be positive")
		}
	}
	return nil
}
