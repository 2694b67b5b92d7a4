// SPDX-License-Identifier: Apache-2.0

//go:build linux

package native

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// hold asks the system about the segment s names, the way UCX will attach it, before UCX does,
// and keeps that segment from going away until release is called, after UCX attached it:
// a segment that cannot be attached makes UCX 1.13 destroy a half-made key, which crashes the
// process (SIGSEGV), and one smaller than the key says lets a view or a get read past it.
//
// A peer that releases its memory or dies (a rolling restart, a SIGKILL) between a check and
// UCX's attach takes the segment with it, so a check alone is not enough. A posix segment is
// opened here and checked through that descriptor: it must be a UCX segment file (procfs: a
// descriptor of the peer's own process) at least as large, rounded up to a page, as the length
// the key declares; the key UCX is handed (attach) then names this descriptor, as
// /proc/<this pid>/fd/<fd>, so UCX attaches the very file checked, whatever the peer does
// meanwhile. A sysv segment is attached here (read-only): Linux keeps an attached segment, and
// lets it be attached again, after its creator removed it or died; it must have been created by
// the peer (where the peer's address names its pid), and its real size becomes the key's bound.
// Anything else is a *RemoteKeyError, with nothing held. key is the packed key s came from.
func (s *keySegment) hold(key []byte) (attach []byte, release func(), err error) {
	bad := func(format string, args ...any) error {
		return &RemoteKeyError{s.at, fmt.Sprintf(format, args...)}
	}
	if s.kind == rkeySysv {
		mem, err := unix.SysvShmAttach(int(s.shmid), 0, unix.SHM_RDONLY)
		if err != nil {
			return nil, nil, bad("sysv segment %d: %v", s.shmid, err)
		}
		release = func() { _ = unix.SysvShmDetach(mem) }
		var ds unix.SysvShmDesc
		if _, err := unix.SysvShmCtl(int(s.shmid), unix.IPC_STAT, &ds); err != nil {
			release()
			return nil, nil, bad("sysv segment %d: %v", s.shmid, err)
		}
		if s.ownerPID != 0 && int(ds.Cpid) != s.ownerPID {
			release()
			return nil, nil, bad("sysv segment %d was created by pid %d, not by the peer (pid %d)", s.shmid, ds.Cpid, s.ownerPID)
		}
		size := uint64(ds.Segsz)
		if size == 0 || s.base+size < s.base {
			release()
			return nil, nil, bad("sysv segment %d of %d bytes at %#x wraps the address space", s.shmid, size, s.base)
		}
		s.size = size
		return key, release, nil
	}
	mmid := s.segID &^ posixSegFlags
	var path string
	switch {
	case s.segID&posixSegFlagProcLink != 0:
		const mask = 1<<posixProcIDBits - 1
		pid, fd := int(mmid&mask), int(mmid>>posixProcIDBits&mask)
		if s.ownerPID == 0 {
			return nil, nil, bad("a procfs segment of pid %d, where the peer's address names no pid to tie it to", pid)
		}
		if pid != s.ownerPID {
			return nil, nil, bad("a procfs segment of pid %d, not of the peer (pid %d)", pid, s.ownerPID)
		}
		path = fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
	case s.segID&posixSegFlagShmOpen != 0:
		path = fmt.Sprintf("/dev/shm/%s%x", posixSegFileName, mmid)
	default:
		path = fmt.Sprintf("%s/%s%x", s.dir, posixSegFileName, mmid)
	}
	// Nothing but a regular file is opened (a peer's FIFO would block the open, a device could
	// act on it); O_NONBLOCK and O_NOCTTY cover what is swapped in before the open, and the
	// descriptor is checked again after it.
	if fi, err := os.Stat(path); err != nil || !fi.Mode().IsRegular() {
		if err == nil {
			err = fmt.Errorf("a %v, not a file", fi.Mode().Type())
		}
		return nil, nil, bad("posix segment %s: %v", path, err)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, bad("posix segment %s: %v", path, err)
	}
	release = func() { _ = unix.Close(fd) }
	own := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), fd)
	if target, err := os.Readlink(own); err != nil || !strings.HasPrefix(filepath.Base(target), posixSegFileName) {
		release()
		return nil, nil, bad("posix segment %s is %q, not a UCX shared-memory segment", path, target)
	}
	var st, via unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		release()
		return nil, nil, bad("posix segment %s: %v", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		release()
		return nil, nil, bad("posix segment %s is not a file (mode %#o)", path, st.Mode)
	}
	page := uint64(os.Getpagesize())
	have := (uint64(st.Size) + page - 1) &^ (page - 1)
	if s.size > have {
		release()
		return nil, nil, bad("a posix segment of %d bytes, where %s has %d", s.size, path, st.Size)
	}
	// UCX opens /proc/PID/fd/FD of the id's pid and descriptor: this process's own, where the
	// descriptor is the file just checked. Where this process's procfs path does not lead to
	// it (a /proc of another pid namespace), the key stays as the peer packed it.
	const mask = 1<<posixProcIDBits - 1
	if unix.Stat(own, &via) != nil || via.Dev != st.Dev || via.Ino != st.Ino || fd > mask || os.Getpid() > mask {
		return key, release, nil
	}
	attach = append([]byte(nil), key...)
	id := s.segID&(posixSegFlagHuge|posixSegFlagPIDNS) | posixSegFlagProcLink |
		uint64(os.Getpid()) | uint64(fd)<<posixProcIDBits
	binary.LittleEndian.PutUint64(attach[s.at:], id)
	return attach, release, nil
}
