// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A local peer's shared-memory receive FIFO, recorded at Connect while the peer lives, so
// that once its process is gone the FIFO can be emptied (Endpoint.releaseDeadPeerFIFO):
// UCX's flush of an endpoint to a dead peer waits for room in that FIFO, which nobody reads
// any more, and only after the flush does UCX fail the endpoint's sends (docs/ucx.md, "Sends
// to a killed shared-memory peer"). The segment is held open (as UCX opens it, through the
// peer's /proc/PID/fd) from the start, since a dead process's file descriptors can no longer
// be reached, and it is written through a mapping of this package's own: a mapping of UCX's
// may go at any moment (another worker of the process destroying its endpoint to the peer).
type peerFIFOSeg struct {
	pid       int
	started   uint64 // the process's start time (/proc/PID/stat, field 22): a reused pid is another process
	dev       uint64 // the segment file's device and inode, which name its mappings in /proc/PID/maps
	ino       uint64
	file      *os.File // posix: the segment, open until close
	shm       []byte   // sysv: the segment as this process attached it, until close (fifo_sysv.go)
	transport string   // "sysv", or "" for posix (for logs)
}

// recordPeerFIFO returns the FIFO segment of the peer at addr, or nil where there is none to
// record: another host or pid namespace, no posix transport, or a peer already gone.
func recordPeerFIFO(addr, local []byte) *peerFIFOSeg {
	if !fifoLayoutKnownOnce() {
		return nil // another UCX may lay its FIFO out otherwise: nothing of it is written
	}
	peer, mine, ok := localPeerFIFO(addr, local)
	if !ok || peer.pid == 0 || peer.pid > 1<<22 {
		return nil
	}
	// The pid and descriptor come from the peer's address: what they name must be a file on
	// the device this process's own FIFO segment is on (UCX's shared-memory directory), not
	// whatever file that process has open.
	var own syscall.Stat_t
	if syscall.Stat(mine.path(), &own) != nil {
		return nil
	}
	f, err := os.OpenFile(peer.path(), os.O_RDWR, 0)
	if err != nil {
		return nil
	}
	var st syscall.Stat_t
	started, _, errProc := procStat(int(peer.pid))
	if syscall.Fstat(int(f.Fd()), &st) != nil || st.Dev != own.Dev || st.Mode&syscall.S_IFMT != syscall.S_IFREG || errProc != nil {
		f.Close()
		return nil
	}
	return &peerFIFOSeg{pid: int(peer.pid), started: started, dev: uint64(st.Dev), ino: st.Ino, file: f}
}

// fifoLayoutKnown reports whether the UCX of version v (UCXVersion, "1.13.1") lays out its
// posix FIFO as ucx_fifo.c reads and writes it: the control block, the elements and the
// active message ids UCP uses were read from the source of 1.13.1 and 1.22.0, which agree,
// and the releases between them. Any other UCX is left alone.
func fifoLayoutKnown(v string) bool {
	f := strings.SplitN(v, ".", 3)
	if len(f) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(f[0])
	minor, err2 := strconv.Atoi(f[1])
	return err1 == nil && err2 == nil && major == 1 && minor >= 13 && minor <= 22
}

var fifoLayoutKnownOnce = sync.OnceValue(func() bool { return fifoLayoutKnown(UCXVersion()) })

// close lets go of the segment; the record is of no more use.
func (s *peerFIFOSeg) close() {
	if s == nil {
		return
	}
	if s.file != nil {
		s.file.Close()
		s.file = nil
	}
	if s.shm != nil {
		_ = unix.SysvShmDetach(s.shm)
		s.shm = nil
	}
}

// mapSeg maps the whole segment for reading and writing, shared with its other mappings.
func (s *peerFIFOSeg) mapSeg() ([]byte, error) {
	if s.file == nil {
		return nil, os.ErrClosed
	}
	fi, err := s.file.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() <= 0 || fi.Size() > 1<<30 {
		return nil, fmt.Errorf("%w: a FIFO segment of %d bytes", ErrInvalidArgument, fi.Size())
	}
	return syscall.Mmap(int(s.file.Fd()), 0, int(fi.Size()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
}

// view is the whole segment, for reading and writing, and how to let go of it: the
// attachment a sysv record holds (detached with the record, by close), or a mapping of the
// posix file made here for the caller (unmapped by release).
func (s *peerFIFOSeg) view() (b []byte, release func(), err error) {
	if s.shm != nil {
		return s.shm, func() {}, nil
	}
	if b, err = s.mapSeg(); err != nil {
		return nil, nil, err
	}
	return b, func() { _ = syscall.Munmap(b) }, nil
}

// gone reports whether the process that owned the FIFO has ended: no such pid any more, a
// zombie or dead one, or a pid another process now holds. A process that cannot be read for
// another reason counts as alive: emptying a live reader's FIFO would lose its messages.
func (s *peerFIFOSeg) gone() bool {
	started, state, err := procStat(s.pid)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return true
	}
	if err != nil {
		return false
	}
	return state == 'Z' || state == 'X' || started != s.started
}

// procStat reads a process's start time and state from /proc/PID/stat.
func procStat(pid int) (started uint64, state byte, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	return parseProcStat(b)
}

// parseProcStat takes the state (field 3) and start time (field 22) out of a /proc/PID/stat
// line. The command name (field 2) is in parentheses and may hold spaces and parentheses:
// the fields resume after the last ')'.
func parseProcStat(b []byte) (started uint64, state byte, err error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("%w: /proc stat line without a command name", ErrInvalidArgument)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("%w: /proc stat line with %d fields after the name", ErrInvalidArgument, len(f))
	}
	started, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: /proc stat start time: %w", ErrInvalidArgument, err)
	}
	return started, f[0][0], nil
}

// mapping is one range of this process's address space.
type mapping struct {
	base, len uintptr
}

// mappingOf is the range b, a mapping of this package's own, covers.
func mappingOf(b []byte) mapping { return mapping{uintptr(unsafe.Pointer(&b[0])), uintptr(len(b))} }

// segMappings returns where this process maps the segment from its first byte, as
// /proc/self/maps lists them (by device and inode), other than the attachment of a sysv
// segment the record holds. Only to learn whether UCX still maps it: a mapping of UCX's may be
// gone by the time it is read.
func (s *peerFIFOSeg) segMappings() ([]mapping, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	maps, err := parseMaps(f, s.dev, s.ino)
	if s.shm != nil {
		own := mappingOf(s.shm).base
		maps = slices.DeleteFunc(maps, func(m mapping) bool { return m.base == own })
	}
	return maps, err
}

// parseMaps picks out of /proc/PID/maps lines ("start-end perms offset major:minor inode
// path") the mappings of device dev, inode ino at offset 0.
func parseMaps(r io.Reader, dev, ino uint64) ([]mapping, error) {
	wantDev := fmt.Sprintf("%02x:%02x", devMajor(dev), devMinor(dev))
	wantIno := strconv.FormatUint(ino, 10)
	var out []mapping
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 || f[4] != wantIno || f[3] != wantDev {
			continue
		}
		if off, err := strconv.ParseUint(f[2], 16, 64); err != nil || off != 0 {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		a, errA := strconv.ParseUint(lo, 16, 64)
		b, errB := strconv.ParseUint(hi, 16, 64)
		if errA != nil || errB != nil || b <= a {
			continue
		}
		out = append(out, mapping{uintptr(a), uintptr(b - a)})
	}
	return out, sc.Err()
}

// devMajor and devMinor split a Linux dev_t (glibc's gnu_dev_major and gnu_dev_minor).
func devMajor(dev uint64) uint64 { return (dev>>8)&0xfff | (dev>>32)&^0xfff }
func devMinor(dev uint64) uint64 { return dev&0xff | (dev>>12)&^0xff }

// fifoWatch (loop-owned) holds the FIFOs of local peers whose endpoints closed with sends UCX
// still held while the peer lived (frozen, or not yet known dead): should the process end
// later, its FIFO is emptied then, and UCX lets go of those sends. An entry goes once its FIFO
// is emptied, or once this process no longer maps it (UCX destroyed its endpoint: the peer
// resumed and read its FIFO).
type fifoWatch struct {
	segs []*peerFIFOSeg
	next time.Time // the next look (fifoWatchEvery)
	// peers are the endpoints to local peers with suspended receives, nextPeers their next
	// look (fifo_dead_recvs.go).
	peers     []*suspectPeer
	nextPeers time.Time
}

// fifoWatchEvery is how often the watch looks; a dead peer's sends are let go of within about
// that much more than UCX's own keepalive would take to tell.
const fifoWatchEvery = 250 * time.Millisecond

func (f *fifoWatch) add(s *peerFIFOSeg) { f.segs = append(f.segs, s) }

// watchDue reports whether a look whose next time is *next is due now, and if so sets the one
// after it, fifoWatchEvery later.
func watchDue(next *time.Time) bool {
	now := time.Now()
	if now.Before(*next) {
		return false
	}
	*next = now.Add(fifoWatchEvery)
	return true
}

// poll looks at the watched FIFOs if it is time: release empties a dead one's FIFO; an entry
// whose segment UCX no longer maps (UCX destroyed its endpoint: the peer resumed and read its
// FIFO) is dropped.
func (f *fifoWatch) poll(release func(*peerFIFOSeg)) {
	if len(f.segs) == 0 || !watchDue(&f.next) {
		return
	}
	keep := f.segs[:0]
	for _, s := range f.segs {
		maps, err := s.segMappings()
		switch {
		case err == nil && len(maps) == 0:
			s.close() // UCX let go of the segment: nothing waits on it any more
		case err == nil && s.gone():
			release(s)
			s.close()
		default:
			keep = append(keep, s)
		}
	}
	clear(f.segs[len(keep):])
	f.segs = keep
}

// close lets go of every watched segment (the worker is closing).
func (f *fifoWatch) close() {
	for _, s := range f.segs {
		s.close()
	}
	f.segs, f.peers = nil, nil
}

// pausedMapper returns a process other than this one that maps the segment and is paused, so
// may yet resume and write into it: stopped or traced (SIGSTOP, a debugger), in an
// uninterruptible sleep, or in a frozen cgroup (cgroup v2's freezer: `docker pause`, which
// /proc shows as sleeping). 0 when there is none. A process whose maps cannot be read is
// passed over: UCX reaches a segment through /proc/PID/fd, which takes the same access.
func (s *peerFIFOSeg) pausedMapper() (int, error) {
	dir, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	self := os.Getpid()
	for _, e := range dir {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		f, err := os.Open("/proc/" + e.Name() + "/maps")
		if err != nil {
			continue
		}
		maps, err := parseMaps(f, s.dev, s.ino)
		f.Close()
		if err != nil || len(maps) == 0 {
			continue
		}
		if _, state, err := procStat(pid); err == nil && (state == 'T' || state == 't' || state == 'D') {
			return pid, nil
		}
		if cgroupFrozen(pid) {
			return pid, nil
		}
	}
	return 0, nil
}

// cgroupFrozen reports whether pid's cgroup is frozen: cgroup v2's cgroup.events says
// "frozen 1", or cgroup v1's freezer.state is not THAWED. What cannot be read counts as not
// frozen (no freezer there to ask).
func cgroupFrozen(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return false // gone, or not ours to read
	}
	for _, line := range strings.Split(string(b), "\n") {
		if path, ok := strings.CutPrefix(line, "0::"); ok {
			if ev, err := os.ReadFile("/sys/fs/cgroup" + path + "/cgroup.events"); err == nil &&
				(strings.Contains(string(ev), "\nfrozen 1") || strings.HasPrefix(string(ev), "frozen 1")) {
				return true
			}
		} else if _, path, ok := strings.Cut(line, ":freezer:"); ok {
			if st, err := os.ReadFile("/sys/fs/cgroup/freezer" + path + "/freezer.state"); err == nil &&
				strings.TrimSpace(string(st)) != "THAWED" {
				return true
			}
		}
	}
	return false
}
