// SPDX-License-Identifier: Apache-2.0

package health

import "time"

// Numbers are what transfer.Engine.Health computes its verdict from (transfer.Health.Numbers).
type Numbers struct {
	InFlight         int64         // handles advertised or in flight
	Quarantined      int64         // handles quarantined now
	BlocksPoisoned   int64         // of those, the ones quarantined for good with the caller's blocks poisoned (L9, docs/invariants.md); not counted against the budget
	PoisonedBlocks   int64         // the callers' KV blocks those poisoned, each counted once
	PoisonedBudget   int           // transfer.Config.Tuning.PoisonedBlockBudget: more PoisonedBlocks is unhealthy
	Remembered       int64         // handles every caller reference released while not quiescent: kept, with their ids and blocks, until they are
	QuarantineBudget int           // transfer.Config.Tuning.QuarantineBudget
	TotalSlots       int           // staging slots, poisoned included
	FreeSlots        int           // slots free now
	PoisonedSlots    int           // slots out of circulation for good
	MinSlots         int           // slots needed to serve transfer.Config.MaxConcurrent transfers
	AwaitingReady    int64         // in-flight streaming transfers waiting on the model's layers, not the wire
	SinceProgress    time.Duration // since the last chunk moved or transfer completed (or an idle engine was asked for one)
	ProgressDeadline time.Duration // transfer.Config.ProgressDeadline
	MalformedControl int64         // control messages that did not decode
	StaleMessages    int64         // messages of an older transfer with the same request id (another nonce), dropped
	// ProtocolRefusals counts the transfers this engine failed because what their peer sent
	// broke the protocol (transfer.ErrProtocol): an offer outside the layout or the peer's segment, a
	// malformed remote key, a read outside what the peer registered (docs/security.md).
	ProtocolRefusals int64
	MoverWedged      bool // a Mover could not say whether its copy ended (transfer.ErrQuiescenceUnknown): the device is not trusted
	TransportWedged  bool // the transport reports it cannot deliver (transport.TransportHealth)
	Closed           bool // the engine is closed
	// Generation words (validated rma and pull reads, docs/onecopy.md): held now and in all, of
	// a transport that counts them (transport.GenerationWords), and the offers declined for want of one.
	GenerationWordsHeld, GenerationWords int
	GenerationDeclines                   int64
}
