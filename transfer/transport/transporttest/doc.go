// SPDX-License-Identifier: Apache-2.0

// Package transporttest is the conformance suite of the Transport contract (package
// transport): every transport passes it, written once, as database drivers pass a shared
// driver test. A transport's own tests call Run with a Harness that makes two of its
// transports that reach each other:
//
//	func TestConformance(t *testing.T) {
//		transporttest.Run(t, transporttest.Harness{Pair: func(t transporttest.TB) (a, b transporttest.Endpoint) {
//			...
//		}})
//	}
//
// The checks: a control message arrives once, copied; a send and a receive each report
// exactly once, finally, with their memory verdict (MemoryDone on success) and every byte; no
// callback runs inside the Post, Cancel or SendControl call that caused it (the suite marks
// the goroutine of each call and every callback checks it is not that one); a cancelled
// unmatched receive reports ErrCancelled with MemoryDone and leaves its buffer alone, and a
// cancel of a finished operation does nothing; Close(true) gives every outstanding operation
// its final report and every later call returns ErrClosed; a transport that bounds its
// control messages (ControlBound) takes ControlRoom bytes and refuses more with a
// *ControlSizeError; a transport with the direct path moves an IOV send into an IOV receive
// cut differently, and one with RMA gets reads a peer's pool by its RMAKey, every byte and one
// final report each. Each check force-closes the pair at its end and then verifies every
// report, so a report after the final one, or none, fails it.
package transporttest
