// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"

	"github.com/kvxfer/kvxfer/buffer"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// Path is how a transfer moves its bytes. It is decided once per sub-transfer, when the
// receiver's request and the sender's answer have met.
type Path int32

// The paths.
const (
	// PathUndecided: not started, or the sender's answer has not arrived yet.
	PathUndecided Path = iota
	// PathStaging: through staging slots (gather, wire, scatter).
	PathStaging
	// PathDirect: one tagged IOV message per chunk, straight between the pools.
	PathDirect
	// PathRMA: RMA gets by the receiver, pool range to pool range.
	PathRMA
)

// String names the path as kvxbench's path column does.
func (p Path) String() string {
	switch p {
	case PathUndecided:
		return "undecided"
	case PathStaging:
		return "staging"
	case PathDirect:
		return "direct"
	case PathRMA:
		return "rma"
	}
	return fmt.Sprintf("path(%d)", int32(p))
}

// Path reports, without blocking, how the transfer moves its bytes; for a multi-peer Receive,
// the slowest of its sub-transfers' paths (undecided while any is).
func (h *Handle) Path() Path {
	p := PathRMA
	for _, x := range h.subs {
		p = min(p, Path(x.pathShown.Load()))
	}
	return p
}

// path is one way a sub-transfer moves its bytes, on one side: through staging slots
// (path_staging.go), as one IOV message per chunk straight between the two pools
// (path_direct.go), or as RMA gets the receiver makes from the sender's pool (path_rma.go).
// The xfer running it keeps all the paths share: the loop and its timers, the chunk schedule,
// the mailbox, abort, quarantine and poison, and the one place each side picks its path
// (runSend, runReceive). A path posts operations and handles their successful completions.
//
// A new path is a new file: a type implementing path, a start function that picks it
// (x.take) where both sides agree on it, and, if the peer talks about it, peerTalk. Nothing in
// the loop changes. What a path must do:
//
//   - Post every operation through x.posted, its callback pushing the completion into the
//     mailbox. The transport gives each operation exactly one final completion with its
//     memory verdict; the loop settles every failure, transport.MemoryBusy and transport.MemoryUnknown verdict
//     (abort, quarantine, poison: L9, L10) before a path sees anything, and hands the path
//     only final, quiescent successes (completed).
//   - Never give back a slot, nor let the caller's blocks go, while an operation that may
//     touch that memory is not final and quiescent: a path releases a slot only in
//     completed, for the operation that just ended, or when it never posted it.
//   - Count bytes with x.progress, and end with x.receivedAll (receiver) or by letting
//     x.maybeSent see the last chunk (sender): no path writes a lifecycle state (state.go).
//
// The paths live in package transfer rather than in an internal package: each reads and drives
// the xfer it runs on (chunk schedule, mailbox, abort, progress, the engine's transport and
// config), and a package boundary between them would be a dozen callbacks wide.
type path interface {
	// kind is what Handle.Path reports while this path runs.
	kind() Path
	// post fills one pipeline place: it posts the next chunk's operation (into slot on the
	// staging path; slot is nil on the others), keeps the place for later when a streaming
	// Send's next chunk is not ready, or gives the place (and slot) up once every chunk is
	// posted. It reports false when the transfer is aborting.
	post(slot *buffer.Slot) bool
	// completed handles an operation's final completion that succeeded with its memory
	// quiescent, on a transfer not aborting: count it, post the next, and end when all moved.
	completed(rec *opRec, c transport.Completion)
}

// stagedPath is a path whose chunks also pass through the mover workers (the staging path):
// the loop hands it a chunk whose copy ended well, on a transfer not aborting. A failed copy,
// or one that ends while the transfer aborts, the loop settles itself (movedDone).
type stagedPath interface {
	moved(rec *opRec)
}

// awaitsAnswer is a receiving path that asked its sender a question (the pull wire's slots,
// the RMA mode's offer) and posts nothing until the answer. A sender that declines sends its
// first chunks as tagged messages right behind the decline, and a send no receive takes
// cannot be cancelled over UCX (docs/ucx.md): when the receiver aborts before the answer,
// takeDeclined posts the receives the decline would have made it post, which the abort then
// cancels with the rest, so the transport takes those chunks as it takes those of any
// cancelled receive (over UCX, its drains) and the sender's operations end instead of
// stranding it into quarantine and poison (its slot, or on the direct path its caller's
// blocks for good). A sender that offered sends no chunk, and the receives are cancelled
// unmatched.
type awaitsAnswer interface {
	// takeDeclined posts those receives, the transfer already aborting; it does nothing
	// once the answer came.
	takeDeclined()
}

// peerTalk is a path the peer's messages about the path reach: an RMA offer, a repeated
// request (which may change the path), a release, a Done, the loss of the peer. The loop asks
// for it by type assertion; a path without it ignores them.
type peerTalk interface {
	// fromPeer takes a message of this transfer (its nonce checked): *RequestInfo (repeated),
	// *RMAOffer, *RMARelease or *Done.
	fromPeer(m wire.Message)
	// peerLost runs before the abort that a lost peer causes.
	peerLost()
}

// requestFlags is a receiving path that shapes the request it sends (and resends).
type requestFlags interface {
	// request adds the path's flags to ri. It reports false when no request should go.
	request(ri *wire.RequestInfo) bool
}

// take puts the sub-transfer on path p, and shows p's kind to Handle.Path.
func (x *xfer) take(p path) {
	x.path = p
	x.pathShown.Store(int32(p.kind()))
}
