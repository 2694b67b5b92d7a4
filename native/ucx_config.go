// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

/*
#include <stdlib.h>
#include "ucx.h"
*/
import "C"

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"go.uber.org/zap"
)

// ContextConfig configures a UCX context. The zero value is valid: every transport UCX finds,
// keepalive every second, no logging.
type ContextConfig struct {
	// TLS is UCX_TLS for this context, e.g. "posix,cma,self" for shared memory or
	// "tcp,self" for TCP. Empty: UCX's default (the environment, else all transports).
	TLS string
	// NetDevices is UCX_NET_DEVICES, e.g. "lo". Empty: all devices.
	NetDevices string
	// KeepaliveInterval is how often UCX checks that a peer is alive; a peer that died
	// without closing its connection is reported after a few intervals. Default 1s; must be
	// at least 10ms.
	KeepaliveInterval time.Duration
	// RendezvousScheme is UCX_RNDV_SCHEME. Never a put-based one by default: with put-based
	// rendezvous a peer frozen after it learned a receive buffer's address writes into it
	// when it resumes, whatever the receiver did meanwhile, and a cancelled or force-closed
	// receive must be safe to reuse. The default depends on what the loaded UCX does
	// (defaultRendezvousScheme): "get_zcopy" under UCX 1.13 (protocols v1), where the
	// receiver pulls the data, falling back to rendezvous by active messages where no lane
	// offers gets (shared memory and TCP with peer error handling); "am" under UCX 1.22
	// (protocols v2), which has no such fallback: with "get_zcopy" its large messages go as
	// multi-fragment eager sends that complete with no receive posted, the receiver's UCX
	// holding whole messages, and a frozen or departing sender's data is then already with
	// the receiver. With "am" they stay rendezvous (the receiver copies each fragment of a
	// matched receive itself; messages above eagerLimitBytes). Either way a receiver bounds
	// what eager messages cost it (WorkerConfig.UnexpectedBytes). "auto" lets UCX choose.
	RendezvousScheme string
	// TCPSegmentBytes is UCX_TCP_TX_SEG_SIZE: the largest piece UCX's TCP transport sends in
	// one copy, hence one send call; a large message goes as many of them. Default 64 KiB,
	// which any peer can receive. Up to TCPReceiveSegmentBytes, which this package makes
	// every TCP receive buffer, so a peer of this package or later takes it: 1 MiB moved a
	// 4096-token request over loopback about twice as fast as 64 KiB (docs/ucx.md, "TCP
	// without zero-copy"). A peer with UCX's default receive buffer (64 KiB: any other UCX
	// program, or kvxfer before it set 1 MiB) cannot take larger ones. Like the other
	// transport settings it goes into the process's environment, unless set there already,
	// when the first context that may use TCP opens: later contexts of the process get the
	// first one's value.
	TCPSegmentBytes int64
	// ShmFIFOSize is UCX_MM_FIFO_SIZE: how many messages the receive FIFO of UCX's
	// shared-memory transports (posix, sysv) holds; 0 keeps UCX's (64). A large message
	// goes through that FIFO in 8 KiB pieces when no zero-copy lane carries it (the case
	// with peer error handling on UCX 1.13), and 64 of them stall the sender on every
	// round: 1024 moved a 4096-token request about twice as fast over shared memory
	// (docs/benchmarks.md, "Shared-memory FIFO"). UCX sizes and indexes a peer's FIFO by
	// its own setting and checks nothing, so every process on the host that talks to this
	// one over shared memory must use the same value: a mismatch hangs or crashes them.
	// A power of two from 64 to 16384. Like the TCP settings it goes into the process's
	// environment, unless set there already, when the first context that may use shared
	// memory opens.
	ShmFIFOSize int
	// NoRMA leaves out UCP_FEATURE_RMA (puts and gets). Such a context posts no puts or gets
	// (each fails at once with ErrInvalidArgument) and, more to the point, serves none: UCX
	// installs the handlers of its RMA emulation (ucp_put_handler, ucp_get_req_handler), which
	// write and read any address a peer's message names with no key, only in a context with
	// the feature. A peer's put or get to it changes and reads nothing (docs/security.md).
	NoRMA bool
	// Logger receives lifecycle events; default zap.NewNop().
	Logger *zap.Logger
	// rndvThresh, when set, is UCX_RNDV_THRESH for this context whatever else says: tests
	// make a sender that sends everything eagerly ("inf"), as any peer may.
	rndvThresh string
	// noWakeup leaves out UCP_FEATURE_WAKEUP: the context's workers then poll with the
	// back-off of a worker UCX cannot wake (Worker.loop). Tests of that loop set it.
	noWakeup bool
}

func (c *ContextConfig) applyDefaults() error {
	if c.KeepaliveInterval == 0 {
		c.KeepaliveInterval = time.Second
	}
	if c.KeepaliveInterval < 10*time.Millisecond {
		return fmt.Errorf("%w: ContextConfig.KeepaliveInterval = %v: must be at least 10ms",
			ErrInvalidArgument, c.KeepaliveInterval)
	}
	if c.TCPSegmentBytes != 0 && (c.TCPSegmentBytes < 8<<10 || c.TCPSegmentBytes > TCPReceiveSegmentBytes) {
		return fmt.Errorf("%w: ContextConfig.TCPSegmentBytes = %d: must be between 8 KiB and %d",
			ErrInvalidArgument, c.TCPSegmentBytes, TCPReceiveSegmentBytes)
	}
	if f := c.ShmFIFOSize; f != 0 && (f < 64 || f > 16384 || f&(f-1) != 0) {
		return fmt.Errorf("%w: ContextConfig.ShmFIFOSize = %d: must be 0 or a power of two from 64 to 16384",
			ErrInvalidArgument, f)
	}
	if c.RendezvousScheme == "" {
		c.RendezvousScheme = defaultRendezvousScheme(protocolsV2())
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return nil
}

// defaultRendezvousScheme is the rendezvous scheme a context gets unless its config names one,
// by how the loaded UCX selects its protocols (docs/ucx.md, "Which UCX"): "get_zcopy" under
// protocols v1 (UCX 1.13), "am" under protocols v2 (UCX 1.22), the one scheme that keeps a
// large message with its sender there until a receive matches it over shared memory and TCP.
func defaultRendezvousScheme(v2 bool) string {
	if v2 {
		return "am"
	}
	return "get_zcopy"
}

// eagerLimitBytes is the largest message a context of this package sends eagerly under UCX's
// protocols v2 with a rendezvous scheme that has a protocol over every lane ("am", "auto"):
// UCX_RNDV_THRESH, unless set in the environment. A larger message is a rendezvous, whose
// data stays with the sender until the receiver has matched a receive for it, so such a peer
// never makes this process's UCX hold more than this for a message nobody receives (UCX
// 1.22 chose 256 to 570 KiB itself). Under protocols v1 (1.13) UCX's own thresholds are
// lower (8 KiB over shared memory, 20 KiB over TCP) and stay.
const eagerLimitBytes = 64 << 10

// protocolsV2 reports whether the UCX loaded selects its protocols with protocols v2
// (UCX_PROTO_ENABLE, 1.22's default).
func protocolsV2() bool { return C.kvx_ucx_protocols_v2() == 1 }

// shmFIFOSize is the number of elements in the shared-memory receive FIFO of a worker created
// now (UCX_MM_FIFO_SIZE: ContextConfig.ShmFIFOSize or the environment where set, else UCX's
// default, which is 64 in 1.13 and 256 in 1.22), as UCX's configuration of its posix transport
// says; 0 when this UCX has no posix transport.
func shmFIFOSize() int { return posixSetting("MM_FIFO_SIZE") }

// shmFIFOElemSize is the size in bytes of an element of that FIFO (UCX_MM_FIFO_ELEM_SIZE,
// UCX's default 128); 0 when this UCX has no posix transport.
func shmFIFOElemSize() int { return posixSetting("MM_FIFO_ELEM_SIZE") }

func posixSetting(name string) int {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return max(int(C.kvx_ucx_mm_config(cname)), 0)
}

// lastSettings is what the most recent context of this process opened with (Settings).
var lastSettings struct {
	sync.Mutex
	list []string
}

// settingsFromEnv are the transport settings NewContext puts into the environment (or finds
// there): UCX reads them from it, so they are what every context of the process runs with.
var settingsFromEnv = []string{"UCX_MM_ERROR_HANDLING", "UCX_MM_FIFO_SIZE", "UCX_TCP_MAX_IOV",
	"UCX_TCP_RX_SEG_SIZE", "UCX_TCP_TX_SEG_SIZE"}

// recordSettings keeps what a context opened with cfg (defaults applied) and the rendezvous
// threshold NewContext gave it ("" for UCX's) runs with, for Settings.
func recordSettings(cfg ContextConfig, rndvThresh string) {
	list := []string{"UCX_RNDV_SCHEME=" + cfg.RendezvousScheme,
		fmt.Sprintf("UCX_KEEPALIVE_INTERVAL=%dms", cfg.KeepaliveInterval.Milliseconds())}
	if rndvThresh == "" {
		rndvThresh, _ = ProcessEnv("UCX_RNDV_THRESH")
	}
	if rndvThresh != "" {
		list = append(list, "UCX_RNDV_THRESH="+rndvThresh)
	}
	for _, name := range settingsFromEnv {
		if v, ok := ProcessEnv(name); ok {
			list = append(list, name+"="+v)
		}
	}
	sort.Strings(list)
	lastSettings.Lock()
	lastSettings.list = list
	lastSettings.Unlock()
}

// Settings is the UCX configuration the most recent context of this process opened with,
// beyond UCX's defaults and its transports (UCX_TLS, UCX_NET_DEVICES): the rendezvous scheme
// and threshold, the keepalive interval, and the transport settings NewContext put into the
// environment or found there, as sorted NAME=value assignments. Another UCX program given
// them, ucx_perftest with peer error handling (-e) say, runs as this package's contexts do on
// this UCX; kvxbench reports them and scripts/bench-paths.sh gives them to its baseline. Nil
// before any context opened.
func Settings() []string {
	lastSettings.Lock()
	defer lastSettings.Unlock()
	return slices.Clone(lastSettings.list)
}

// ProcessEnv is the value of name in the process's environment as C code (UCX) reads it.
// NewContext puts its transport settings there; os.Getenv does not see them, since Go reads
// a copy of the environment made when the process started.
func ProcessEnv(name string) (string, bool) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	v := C.getenv(cs)
	if v == nil {
		return "", false
	}
	return C.GoString(v), true
}

// TCPSendSegmentBytes is the largest piece this context's TCP transport sends in one copy: the
// UCX_TCP_TX_SEG_SIZE of the process's environment (NewContext sets it, unless set already), or
// 0 when the context's transports cannot include TCP. A value UCX reads but this cannot
// ("inf", "auto") counts as the largest, MaxInt64.
func (c *Context) TCPSendSegmentBytes() int64 {
	tls := c.cfg.TLS
	if tls == "" {
		tls, _ = ProcessEnv("UCX_TLS")
	}
	if !wantsTCP(tls) {
		return 0
	}
	v, ok := ProcessEnv("UCX_TCP_TX_SEG_SIZE")
	if !ok {
		return 8 << 10 // UCX 1.13's own default
	}
	return parseMemUnits(v)
}

// wantsTCP is ucx.c's wants_tcp: whether a UCX_TLS list can select TCP.
func wantsTCP(tls string) bool {
	if tls == "" || strings.Contains(tls, "all") {
		return true
	}
	named := strings.Contains(tls, "tcp")
	if tls[0] == '^' {
		return !named
	}
	return named
}

// parseMemUnits reads a UCX size ("65536", "64k", "1m", "2G"), or MaxInt64 when it cannot.
func parseMemUnits(v string) int64 {
	v = strings.ToLower(strings.TrimSpace(v))
	mult := int64(1)
	switch {
	case strings.HasSuffix(v, "g"), strings.HasSuffix(v, "gb"):
		mult = 1 << 30
	case strings.HasSuffix(v, "m"), strings.HasSuffix(v, "mb"):
		mult = 1 << 20
	case strings.HasSuffix(v, "k"), strings.HasSuffix(v, "kb"):
		mult = 1 << 10
	}
	n, err := strconv.ParseInt(strings.TrimRight(v, "bkmg"), 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return math.MaxInt64
	}
	return n * mult
}
