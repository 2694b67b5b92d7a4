// SPDX-License-Identifier: Apache-2.0

//go:build linux

package native

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// check asks the system about the segment s names, the way UCX will attach it, before UCX does:
// a segment that cannot be attached makes UCX 1.13 destroy a half-made key, which crashes the
// process, and one smaller than the key says lets a view or a get read past it. A posix
// segment must be a UCX segment file (procfs: a descriptor of the peer's own process) at
// least as large, rounded up to a page, as the length the key declares; a sysv segment must
// exist and (where the peer's address names its pid) have been created by the peer, and its
// real size becomes the key's bound. Anything else is a *RemoteKeyError.
func (s *keySegment) check() error {
	bad := func(format string, args ...any) error {
		return &RemoteKeyError{s.at, fmt.Sprintf(format, args...)}
	}
	if s.kind == rkeySysv {
		var ds unix.SysvShmDesc
		if _, err := unix.SysvShmCtl(int(s.shmid), unix.IPC_STAT, &ds); err != nil {
			return bad("sysv segment %d: %v", s.shmid, err)
		}
		if s.ownerPID != 0 && int(ds.Cpid) != s.ownerPID {
			return bad("sysv segment %d was created by pid %d, not by the peer (pid %d)", s.shmid, ds.Cpid, s.ownerPID)
		}
		size := uint64(ds.Segsz)
		if size == 0 || s.base+size < s.base {
			return bad("sysv segment %d of %d bytes at %#x wraps the address space", s.shmid, size, s.base)
		}
		s.size = size
		return nil
	}
	mmid := s.segID &^ posixSegFlags
	var path string
	switch {
	case s.segID&posixSegFlagProcLink != 0:
		const mask = 1<<posixProcIDBits - 1
		pid, fd := int(mmid&mask), int(mmid>>posixProcIDBits&mask)
		if s.ownerPID == 0 {
			return bad("a procfs segment of pid %d, where the peer's address names no pid to tie it to", pid)
		}
		if pid != s.ownerPID {
			return bad("a procfs segment of pid %d, not of the peer (pid %d)", pid, s.ownerPID)
		}
		path = fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
		target, err := os.Readlink(path)
		if err != nil {
			return bad("posix segment %s: %v", path, err)
		}
		if !strings.HasPrefix(filepath.Base(target), posixSegFileName) {
			return bad("posix segment %s is %q, not a UCX shared-memory segment", path, target)
		}
	case s.segID&posixSegFlagShmOpen != 0:
		path = fmt.Sprintf("/dev/shm/%s%x", posixSegFileName, mmid)
	default:
		path = fmt.Sprintf("%s/%s%x", s.dir, posixSegFileName, mmid)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return bad("posix segment: %v", err)
	}
	if !fi.Mode().IsRegular() {
		return bad("posix segment %s is a %v, not a file", path, fi.Mode().Type())
	}
	page := uint64(os.Getpagesize())
	have := (uint64(fi.Size()) + page - 1) &^ (page - 1)
	if s.size > have {
		return bad("a posix segment of %d bytes, where %s has %d", s.size, path, fi.Size())
	}
	return nil
}
