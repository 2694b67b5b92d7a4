// SPDX-License-Identifier: Apache-2.0

// Package mem is an in-process transport.Transport: engines in one process exchange real
// bytes through a Network, and tests make that network fail the ways a real one does
// (SetFault: delays, hangs, partial copies, lost and duplicated control messages, cancels
// that do nothing, operations that never quiesce; LosePeer; SetMaxControl). It implements
// the direct path and its RMA mode with validated reads, and can pretend its gets are
// emulated (EmulateGets) or spread over lanes (SetGetLanes).
//
//	n := mem.NewNetwork()
//	prefill, _ := transfer.New(n.Transport("prefill"), transfer.Config{})
//	decode, _ := transfer.New(n.Transport("decode"), transfer.Config{})
//
// A FaultPoint names a message by its sender, receiver, kind (transport.KindData for a data
// chunk, otherwise the engine's control kind) and tag.
package mem
