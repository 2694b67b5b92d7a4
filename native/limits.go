// SPDX-License-Identifier: Apache-2.0

package native

// The bounds below hold with or without cgo: configuration is checked against them in both
// builds (a build without cgo refuses a UCX transport, but still says which values it takes).

// TCPReceiveSegmentBytes is UCX_TCP_RX_SEG_SIZE as NewContext sets it: the largest segment a
// peer may send this process over TCP (ContextConfig.TCPSegmentBytes).
const TCPReceiveSegmentBytes = 1 << 20

// MaxLanes bounds the UCX workers (lanes) one transport opens over its context
// (ucx.Config.Lanes): each lane is a worker and an OS thread.
const MaxLanes = 64
