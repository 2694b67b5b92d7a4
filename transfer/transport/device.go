// SPDX-License-Identifier: Apache-2.0

package transport

// DeviceRMATransport is an optional extension of RMATransport for pools in device memory the
// caller registered with the transport (the UCX transport's RegisterDevice). Go never
// addresses device memory, so a device pool is named by its address and length, never by a
// slice: the engine hands these methods numbers and the transport finds the registration
// holding them. A get into or out of a device region goes GPU to GPU where the transport can
// (UCX: cuda_ipc on one node, GPUDirect RDMA across nodes), with no staging and no kernel.
type DeviceRMATransport interface {
	RMATransport
	// DeviceGets reports whether this transport can move device memory with gets at all (UCX:
	// a CUDA-enabled build). It never blocks.
	DeviceGets() bool
	// CheckDevice reports nil when [addr, addr+n) lies inside one live device registration,
	// else a *RegionError matching ErrBadRegion (not registered, host memory, or past the
	// registration's end) or ErrClosed.
	CheckDevice(addr uint64, n int64) error
	// HoldDevice marks the device registration holding [addr, addr+n) as used by one
	// transfer, as PoolHolder.HoldPool does for a host pool; nil when none holds it.
	HoldDevice(addr uint64, n int64) (release func())
	// RMAKeyAt is RMAKey for a device range CheckDevice accepted: the address that names addr
	// in a peer's gets, and the packed remote key of its registration.
	RMAKeyAt(addr uint64, n int64) (raddr uint64, key []byte, err error)
	// PostGetAt is PostGet into the n bytes of device memory at dstAddr, which lie in a
	// region CheckDevice accepted. The rules of PostGet hold.
	PostGetAt(from Peer, tag Tag, key []byte, addr uint64, dstAddr uint64, n int64, done func(Completion)) (OpID, error)
}
