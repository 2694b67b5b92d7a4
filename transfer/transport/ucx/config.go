// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

// Config and its defaults.

import (
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"go.uber.org/zap"
)

// Config configures a Transport. Zero values take the documented defaults.
type Config struct {
	// TLS is UCX_TLS, e.g. "posix,cma,self" (shared memory) or "tcp,self". Default: UCX's.
	TLS string
	// NetDevices is UCX_NET_DEVICES, e.g. "lo". Default: all.
	NetDevices string
	// KeepaliveInterval is UCX's peer liveness check period. Default 1s.
	KeepaliveInterval time.Duration
	// StagingBytes is the size of the UCX-allocated region StagingMemory returns, to pass as
	// transfer.Config.StagingMemory. Default 512 MiB, room for the engine's default staging pool.
	StagingBytes int64
	// maxControlBytes bounds one control message. Default 4096.
	maxControlBytes int
	// CloseTimeout bounds Close. Default 5s.
	CloseTimeout time.Duration
	// drainTimeout is how long the tag of a cancelled receive stays drained: a message that
	// arrives for it in that time is received into the transport's own scratch memory and
	// dropped, which is what completes the peer's send (UCX 1.13 keeps a rendezvous send that
	// no receive matches forever, so its sender would have to poison the slot). It should
	// outlast the longest stop of a peer process that must not cost slots. Default 30s.
	drainTimeout time.Duration
	// drainAhead is how many chunks past a cancelled receive are drained too, and past a
	// receive asked to cancel that a chunk matched first: a sender may have sent up to its
	// pipeline depth of chunks beyond the receiver's last posted receive (their predecessors
	// completed as the receiver aborted). Default 4.
	drainAhead int
	// maxDrains bounds the drain receives posted at once, so a cancel storm cannot grow
	// memory without bound; past it a cancelled receive gets no drain (counted in
	// drainCounters.Skipped) and a late send to it strands as before. Default 65536.
	maxDrains int
	// rendezvous is the context's UCX rendezvous scheme ("": native's default for the UCX
	// loaded: get_zcopy under protocols v1, am under v2). NewDevice sets get_zcopy: device
	// memory between two processes moves by cuda_ipc gets (docs/gpu-results.md).
	rendezvous string
	// ProbeInterval is how often a second worker in this process sends the transport's worker
	// a small message over the transports a local peer would use (see probe.go): UCX's
	// shared-memory receive queue is wedged for good when a local peer dies while writing to
	// it, and the probe's missing messages are how Health tells, traffic or not. Default 1s;
	// negative: no probe.
	ProbeInterval time.Duration
	// ProbeTimeout is how long a probe message may take to arrive before Health reports the
	// worker wedged (transport.ErrTransportWedged). Default 10s.
	ProbeTimeout time.Duration
	// ReplaceWedgedWorker: when the probe finds the worker wedged, replace it rather than only
	// report it (rebirth.go). Every operation of the old worker fails, every peer it had an
	// endpoint to is reported lost, and the transport gets a new worker address: Self and
	// ContextParams change, and peers must be given the new address, as after a restart of the
	// process. Off by default: a false alarm (a process starved for ProbeTimeout) would cost the
	// transfers in flight and the address callers hold.
	ReplaceWedgedWorker bool
	// Lanes is how many UCX workers, each with its own progress thread, the RMA gets of this
	// side are striped over (lanes.go): the transport's own worker and Lanes-1 more, made
	// on the first get. A get is one copy made by the thread that posts it (shared memory,
	// cma), so one worker bounds every request to one core. 1 keeps every get on the
	// transport's worker. Default: 4, at most GOMAXPROCS; at most 64 (native.MaxLanes).
	Lanes int
	// TCPSegmentBytes is the largest piece UCX's TCP transport sends in one copy
	// (native.ContextConfig.TCPSegmentBytes): a large message over TCP goes as many such
	// sends, so larger pieces cost fewer system calls and wake-ups on both sides: 1 MiB moved
	// a 4096-token request over loopback several times as fast as 64 KiB (docs/ucx.md, "TCP:
	// what the engine does"). Default and most: 1 MiB (native.TCPReceiveSegmentBytes), the receive
	// buffer of every transport of this package. A receiver with UCX's default 64 KiB buffer
	// (an engine of an earlier build) cannot take them: the engine sends data only to a peer
	// whose hello says it can (the large-segments feature) and refuses the others with a
	// transfer.ErrPeerLacksFeature before anything is sent; set 64 KiB to serve such peers.
	// Process-wide: the first transport that may use TCP sets it for the process, unless
	// UCX_TCP_TX_SEG_SIZE is set already (SendsLargeSegments reports what holds).
	TCPSegmentBytes int64
	// ShmFIFOSize is how many messages the receive FIFO of UCX's shared-memory transport
	// holds (native.ContextConfig.ShmFIFOSize, UCX_MM_FIFO_SIZE); 0 keeps UCX's 64. The
	// staging and IOV paths over shared memory send their messages through that FIFO, and
	// 1024 moved them about twice as fast here (docs/benchmarks.md, "Shared-memory FIFO").
	// Opt-in because UCX checks nothing: every process on the host that talks to this one
	// over shared memory must use the same value, or they hang or crash. Process-wide, like
	// TCPSegmentBytes. A power of two from 64 to 16384.
	ShmFIFOSize int
	// CMAReadTimeout bounds one process_vm_readv call of a get from a peer's pool on this
	// host (cma.go; docs/security.md, "Same-host reads (process_vm_readv)"): a call reads at
	// most 4 MiB, a millisecond's copy, but a peer's memory backed by userfaultfd or FUSE can
	// hold it for ever, and the kernel lets no signal stop it. A call past the bound fails its
	// get with its memory unknown (the engine poisons the destination, L9), that peer's memory
	// is read through UCX from then on, and Close stops waiting for it. Default 5s.
	CMAReadTimeout time.Duration
	// ServeEmulatedRMA keeps UCX's RMA on a transport whose transports are TCP only (TLS
	// naming tcp and self and nothing else). By default such a transport opens UCX without
	// RMA: every get over TCP would be UCX's emulation, which the engine does not take unless
	// transfer.Config.Tuning.RMAWhereEmulated says so, and the emulation's handlers, once
	// installed, write and read any address of this process that a peer's message names
	// (docs/security.md, "What UCX itself serves to a connected peer"). Without RMA the
	// transport posts no gets and serves none; the engine moves the data by messages (the
	// direct path's IOV messages, or staging), as it does over TCP by default. Set it, with
	// Tuning.RMAWhereEmulated on both engines, only where every process that can reach this
	// worker's TCP interfaces is trusted. Transports that include shared memory, RDMA or CUDA
	// keep RMA whatever this says.
	ServeEmulatedRMA bool
	// Logger receives peer failures. Default zap.NewNop().
	Logger *zap.Logger
}

// rmaWanted reports whether a transport of this configuration opens UCX with RMA: always,
// unless its transports are TCP only (tlsTCPOnly) and ServeEmulatedRMA is off.
func (c *Config) rmaWanted() bool {
	tls := c.TLS
	if tls == "" {
		tls, _ = native.ProcessEnv("UCX_TLS")
	}
	return c.ServeEmulatedRMA || !tlsTCPOnly(tls)
}

// tlsTCPOnly reports whether a UCX_TLS list selects TCP and nothing else that moves bytes
// between processes ("self" is the process's loopback to itself): "tcp", "tcp,self". An
// empty list, "all", an exclusion ("^...") or any other transport (shared memory, RDMA,
// CUDA, an alias such as "sm") is not.
func tlsTCPOnly(tls string) bool {
	tls = strings.TrimSpace(tls)
	if tls == "" || strings.HasPrefix(tls, "^") {
		return false
	}
	tcp := false
	for _, name := range strings.Split(tls, ",") {
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "tcp":
			tcp = true
		case "self":
		default:
			return false
		}
	}
	return tcp
}

func (c *Config) applyDefaults() error {
	if c.StagingBytes == 0 {
		c.StagingBytes = defaultStagingBytes
	}
	if c.StagingBytes < 0 {
		return &transport.ConfigError{Field: "ucx.Config.StagingBytes", Value: c.StagingBytes, Reason: "must be positive"}
	}
	if c.maxControlBytes == 0 {
		c.maxControlBytes = 4096
	}
	if c.maxControlBytes < 256 {
		return &transport.ConfigError{Field: "ucx.Config.maxControlBytes", Value: c.maxControlBytes, Reason: "must be at least 256 (a request-info message)"}
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = 5 * time.Second
	}
	if c.CloseTimeout < 0 {
		return &transport.ConfigError{Field: "ucx.Config.CloseTimeout", Value: c.CloseTimeout, Reason: "must be positive"}
	}
	if c.drainTimeout == 0 {
		c.drainTimeout = defaultDrainTimeout
	}
	if c.drainTimeout < 0 {
		return &transport.ConfigError{Field: "ucx.Config.drainTimeout", Value: c.drainTimeout, Reason: "must be positive"}
	}
	if c.drainAhead == 0 {
		c.drainAhead = defaultDrainAhead
	}
	if c.drainAhead < 0 || c.drainAhead > 1024 {
		return &transport.ConfigError{Field: "ucx.Config.drainAhead", Value: c.drainAhead, Reason: "must be between 1 and 1024"}
	}
	if c.maxDrains == 0 {
		c.maxDrains = defaultMaxDrains
	}
	if c.maxDrains < 0 {
		return &transport.ConfigError{Field: "ucx.Config.maxDrains", Value: c.maxDrains, Reason: "must be positive"}
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = defaultProbeInterval
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = defaultProbeTimeout
	}
	if c.ProbeTimeout < 0 || (c.ProbeInterval > 0 && c.ProbeTimeout < c.ProbeInterval) {
		return &transport.ConfigError{Field: "ucx.Config.ProbeTimeout", Value: c.ProbeTimeout, Reason: "must be positive and at least ProbeInterval"}
	}
	if c.Lanes == 0 {
		c.Lanes = max(1, min(defaultLanes, runtime.GOMAXPROCS(0)))
	}
	if c.Lanes < 1 || c.Lanes > maxLanes {
		return &transport.ConfigError{Field: "ucx.Config.Lanes", Value: c.Lanes, Reason: fmt.Sprintf("must be between 1 and %d", maxLanes)}
	}
	if c.TCPSegmentBytes == 0 {
		c.TCPSegmentBytes = maxTCPSegmentBytes
	}
	if c.TCPSegmentBytes < 8<<10 || c.TCPSegmentBytes > maxTCPSegmentBytes {
		return &transport.ConfigError{Field: "ucx.Config.TCPSegmentBytes", Value: c.TCPSegmentBytes,
			Reason: fmt.Sprintf("must be between 8 KiB and %d", maxTCPSegmentBytes)}
	}
	if f := c.ShmFIFOSize; f != 0 && (f < 64 || f > 16384 || f&(f-1) != 0) {
		return &transport.ConfigError{Field: "ucx.Config.ShmFIFOSize", Value: f, Reason: "must be 0 or a power of two from 64 to 16384"}
	}
	if c.CMAReadTimeout == 0 {
		c.CMAReadTimeout = defaultCMAReadTimeout
	}
	if c.CMAReadTimeout < 0 {
		return &transport.ConfigError{Field: "ucx.Config.CMAReadTimeout", Value: c.CMAReadTimeout, Reason: "must be positive"}
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return nil
}

// defaultCMAReadTimeout is Config.CMAReadTimeout's default.
const defaultCMAReadTimeout = 5 * time.Second

// defaultTCPReceiveSegmentBytes is the receive buffer of UCX's TCP transport as UCX sets it
// (UCX_TCP_RX_SEG_SIZE): what a peer not of this package takes in one segment.
const defaultTCPReceiveSegmentBytes = 64 << 10

var _ transport.LargeSegmentSender = (*ucxTransport)(nil)

// SendsLargeSegments implements transport.LargeSegmentSender: whether this transport's TCP
// segments (the process's UCX_TCP_TX_SEG_SIZE, which the first transport set) are larger than
// defaultTCPReceiveSegmentBytes. Always false when its transports cannot include TCP.
func (t *ucxTransport) SendsLargeSegments() bool {
	return t.uctx.TCPSendSegmentBytes() > defaultTCPReceiveSegmentBytes
}
