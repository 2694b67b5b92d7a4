// SPDX-License-Identifier: Apache-2.0

package native

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
)

// A posix segment id with the procfs flag names the segment as a file descriptor of the process
// that mapped it, /proc/PID/fd/FD: PID in the low 30 bits of the id, FD in the 30 above
// (UCT_POSIX_SEG_FLAG_PROC_LINK and UCT_POSIX_PROCFS_MMID_*_BITS, mm_posix.c).
const (
	posixSegFlagProcLink = 1 << 63
	posixSegFlagPIDNS    = 1 << 60
	posixProcIDBits      = 30
)

// posixFIFO is what a worker address says of its posix receive FIFO: the device address (the
// host's system id: equal addresses, same host) and the file the FIFO segment is.
type posixFIFO struct {
	dev     []byte
	pid, fd uint64
	nsFlag  bool   // the pid is in a pid namespace the address names (UCT_POSIX_SEG_FLAG_PID_NS)
	rest    []byte // what follows the segment id: the namespace, a directory
	at      int    // offset of the segment id in the address
}

func (f posixFIFO) path() string { return fmt.Sprintf("/proc/%d/fd/%d", f.pid, f.fd) }

// findPosixFIFO returns the posix FIFO addr names, or ok=false when it has no posix transport
// or names the segment some other way than through procfs.
func findPosixFIFO(addr []byte, withName bool) (f posixFIFO, ok bool) {
	_ = walkAddressEntries(addr, withName, func(e addrEntry) error {
		if e.csum != addrPosixChecksum || len(e.iface) < 8 {
			return nil
		}
		id := binary.LittleEndian.Uint64(e.iface)
		if id&posixSegFlagProcLink == 0 {
			return nil
		}
		const mask = 1<<posixProcIDBits - 1
		f, ok = posixFIFO{dev: e.dev, pid: id & mask, fd: (id >> posixProcIDBits) & mask,
			nsFlag: id&posixSegFlagPIDNS != 0, rest: e.iface[8:], at: e.at}, true
		return nil
	})
	return f, ok
}

// checkPeerFIFO refuses a peer on this host whose shared-memory receive FIFO differs in size
// from this process's. UCX sizes and indexes a peer's FIFO by its own UCX_MM_FIFO_SIZE
// (ContextConfig.ShmFIFOSize) and checks nothing: with a larger one it writes past the end of
// the peer's segment (the process dies of SIGBUS), with a smaller one the two never agree on
// where the next message is (both hang). The sizes are those of the two FIFO segments, read
// through procfs, which UCX itself opens to attach them. Whatever cannot be read (another host,
// a peer gone, no permission, a layout this check does not know) is left to UCX.
func checkPeerFIFO(addr, local []byte) error {
	peer, mine, ok := localPeerFIFO(addr, local)
	if !ok {
		return nil
	}
	a, errA := os.Stat(mine.path())
	b, errB := os.Stat(peer.path())
	if errA != nil || errB != nil || a.Size() == b.Size() {
		return nil
	}
	return &AddressError{peer.at, fmt.Sprintf("the peer's shared-memory receive FIFO is a %d-byte segment, this process's %d bytes: "+
		"both must run with the same UCX_MM_FIFO_SIZE (ContextConfig.ShmFIFOSize), or UCX overruns or loses the other's messages",
		b.Size(), a.Size())}
}

// localPeerFIFO returns the posix FIFOs of addr, a peer's worker address, and of local, this
// process's, when both are on this host, in this pid namespace, named through procfs: the
// peer's pid is then a process this one can look up.
func localPeerFIFO(addr, local []byte) (peer, mine posixFIFO, ok bool) {
	withName, err := addressHasName(local)
	if err != nil {
		return peer, mine, false
	}
	mine, ok = findPosixFIFO(local, withName)
	if !ok || mine.pid != uint64(os.Getpid()) {
		return peer, mine, false // not this process's pid: a layout this check does not know
	}
	peer, ok = findPosixFIFO(addr, withName)
	if !ok || !bytes.Equal(peer.dev, mine.dev) || peer.nsFlag != mine.nsFlag || !bytes.Equal(peer.rest, mine.rest) {
		return peer, mine, false // no posix transport, another host, or another pid namespace: its pid is not ours to look up
	}
	return peer, mine, true
}
