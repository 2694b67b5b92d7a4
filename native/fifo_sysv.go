// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A local peer's sysv receive FIFO. UCX's sysv transport lays its FIFO out as posix does (both
// are UCT's mm transports), and where UCX_TLS leaves both in, UCX gives an endpoint's active
// messages to sysv: the soak's hung peer, stopped and then killed, left a receiver's requests
// with UCX behind the full sysv FIFO of the dead peer, which only posix's was emptied of
// (docs/ucx.md, "Sends to a killed shared-memory peer"). The FIFO is a System V segment, which
// UCX removes (IPC_RMID) as soon as it made it: it lives while a process has it attached. The
// endpoint attaches it itself at Connect, while the peer lives, and holds it until it lets go
// of the record; a dead peer's FIFO is emptied through that attachment.

// addrSysvChecksum is the name checksum UCX writes for the sysv transport (ucs_crc16_string of
// "sysv", as addrPosixChecksum is of "posix").
const addrSysvChecksum = 0x538d

// sysvFIFO is what a worker address says of its sysv receive FIFO: the device address (the
// host's system id: equal addresses, same host) and the segment's id (its shmid: the
// interface address is uct_mm_iface_addr_t's fifo_seg_id, with nothing after it).
type sysvFIFO struct {
	dev   []byte
	shmid int
	at    int // offset of the segment id in the address
}

// findSysvFIFO returns the sysv FIFO addr names, or ok=false when it has no sysv transport or
// an id that is no shmid.
func findSysvFIFO(addr []byte, withName bool) (f sysvFIFO, ok bool) {
	_ = walkAddressEntries(addr, withName, func(e addrEntry) error {
		if e.csum != addrSysvChecksum || len(e.iface) != 8 {
			return nil
		}
		if id := binary.LittleEndian.Uint64(e.iface); id <= math.MaxInt32 {
			f, ok = sysvFIFO{dev: e.dev, shmid: int(id), at: e.at}, true
		}
		return nil
	})
	return f, ok
}

// recordPeerSysvFIFO returns the sysv FIFO segment of the peer at addr, attached by this
// process, or nil where there is none to record: another host, no sysv transport on either
// side, or no segment the kernel says the process whose FIFO it holds made. The shmid is the
// peer's word; whose segment it is comes from the kernel (IPC_STAT's creator pid), and the
// segment is kept only if its FIFO control block names that same process as its reader, and
// that process is one this process can look up (running, in this pid namespace).
func recordPeerSysvFIFO(addr, local []byte) *peerFIFOSeg {
	if !fifoLayoutKnownOnce() {
		return nil
	}
	withName, err := addressHasName(local)
	if err != nil {
		return nil
	}
	mine, ok := findSysvFIFO(local, withName)
	if !ok {
		return nil // this process's UCX runs no sysv transport: it attaches no peer's FIFO
	}
	peer, ok := findSysvFIFO(addr, withName)
	if !ok || !bytes.Equal(peer.dev, mine.dev) {
		return nil
	}
	var ds unix.SysvShmDesc
	if _, err := unix.SysvShmCtl(peer.shmid, unix.IPC_STAT, &ds); err != nil {
		return nil
	}
	pid := int(ds.Cpid)
	if pid <= 0 || ds.Segsz < fifoCtlBytes || ds.Segsz > 1<<30 {
		return nil
	}
	started, _, err := procStat(pid)
	if err != nil {
		return nil
	}
	b, err := unix.SysvShmAttach(peer.shmid, 0, 0)
	if err != nil {
		return nil
	}
	s := &peerFIFOSeg{pid: pid, started: started, shm: b, transport: "sysv"}
	if int(int32(binary.LittleEndian.Uint32(b[fifoPIDOffset:]))) != pid {
		s.close() // not a FIFO whose reader is the process that made the segment
		return nil
	}
	if s.dev, s.ino, err = mapsEntryAt(mappingOf(b).base); err != nil {
		s.close()
		return nil
	}
	return s
}

// The FIFO control block's size and the offset of its reader's pid (ucx_fifo.c).
const (
	fifoCtlBytes  = 192
	fifoPIDOffset = 136
)

// mapsEntryAt returns the device and inode /proc/self/maps lists for the mapping that starts
// at base: how this process's other mappings of the same segment are found (segMappings).
func mapsEntryAt(base uintptr) (dev, ino uint64, err error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	want := strconv.FormatUint(uint64(base), 16) + "-"
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || !strings.HasPrefix(fields[0], want) {
			continue
		}
		major, minor, ok := strings.Cut(fields[3], ":")
		maj, errMaj := strconv.ParseUint(major, 16, 32)
		mnr, errMin := strconv.ParseUint(minor, 16, 32)
		ino, errIno := strconv.ParseUint(fields[4], 10, 64)
		if !ok || errMaj != nil || errMin != nil || errIno != nil {
			return 0, 0, fmt.Errorf("%w: /proc/self/maps line %q", ErrInvalidArgument, sc.Text())
		}
		return makeDev(maj, mnr), ino, nil
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	return 0, 0, fmt.Errorf("%w: no mapping at %#x in /proc/self/maps", ErrInvalidArgument, base)
}

// makeDev is a Linux dev_t of major and minor (glibc's gnu_dev_makedev), the inverse of
// devMajor and devMinor.
func makeDev(major, minor uint64) uint64 {
	return minor&0xff | (major&0xfff)<<8 | (minor&^0xff)<<12 | (major&^0xfff)<<32
}

// recordPeerFIFOs returns every shared-memory receive FIFO of the peer at addr this process can
// record (recordPeerFIFO, recordPeerSysvFIFO): the endpoint's lanes may use either.
func recordPeerFIFOs(addr, local []byte) []*peerFIFOSeg {
	var segs []*peerFIFOSeg
	for _, s := range []*peerFIFOSeg{recordPeerFIFO(addr, local), recordPeerSysvFIFO(addr, local)} {
		if s != nil {
			segs = append(segs, s)
		}
	}
	return segs
}

// closeFIFOSegs lets go of each of segs.
func closeFIFOSegs(segs []*peerFIFOSeg) {
	for _, s := range segs {
		s.close()
	}
}
