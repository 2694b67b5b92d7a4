// SPDX-License-Identifier: Apache-2.0

// Package vectorget is how package transfer reaches a transport's vector gets (many small
// ranges of a peer's memory read in one operation: the UCX transport, from a process on this
// host, by process_vm_readv) without a public interface for them: the UCX transport fills
// Hooks when it is linked in. A receiver whose pool or whose sender's pool holds the stream in
// pieces too small for one get each (a TP=2 rank's half of the heads in layer-major-nhd: 1 KiB)
// then takes the RMA mode and reads each chunk of the stream as one vector get, instead of
// bouncing the pieces through staging.
package vectorget

import "github.com/kvxfer/kvxfer/transfer/transport"

// Range is a range of a peer's memory, as a vector get names it.
type Range struct {
	Addr uint64
	Len  int
}

// Hooks is filled by package ucx's init; every function takes the transport as tr and
// reports false (or fails) for a transport that is not its own.
var Hooks struct {
	// VectorGets reports whether gets from peer from may go as vectors. With a nil key it
	// decides nothing and answers at once whether they might (a receiver choosing its path);
	// with the key of an offer it decides, and may wait a bounded time to (UCX proves the
	// peer's process and the ranges its key covers first, docs/security.md).
	VectorGets func(tr any, from transport.Peer, key []byte) bool
	// PostGetVector reads src, ranges of from's memory named by key, in order as one stream,
	// into the pieces of dst, in order: byte i of the one lands at byte i of the other, so
	// the two lists need not pair up piece for piece, only their totals must agree. It has
	// RMATransport.PostGet's contract: one final completion with its memory verdict; Cancel
	// reports MemoryBusy while a read runs. Every range of src lies in memory the peer's key
	// covers, or the get fails before anything is read (ErrProtocol).
	PostGetVector func(tr any, from transport.Peer, tag transport.Tag, key []byte, src []Range, dst [][]byte, done func(transport.Completion)) (transport.OpID, error)
}
