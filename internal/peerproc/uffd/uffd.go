// SPDX-License-Identifier: Apache-2.0

// Package uffd makes memory that blocks whoever reads it from outside, for the tests and test
// peers that check a process_vm_readv read is bounded in time: a pool backed by a stalled
// userfaultfd (or a FUSE file) holds such a read until the faults are served.
package uffd

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Block drops mem's pages and registers mem with a new userfaultfd for missing pages that
// nobody serves: every access to mem from outside this process blocks until the process
// exits and the file is released. The caller never touches mem again.
func Block(mem []byte) error {
	const (
		uffdAPI          = 0xAA
		uffdioAPI        = 0xc018aa3f // _IOWR(0xAA, 0x3F, struct uffdio_api)
		uffdioRegister   = 0xc020aa00 // _IOWR(0xAA, 0x00, struct uffdio_register)
		uffdRegisterMiss = 1
	)
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if errno != 0 {
		return fmt.Errorf("userfaultfd: %w", errno)
	}
	api := [3]uint64{uffdAPI, 0, 0}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, uffdioAPI, uintptr(unsafe.Pointer(&api))); errno != 0 {
		return fmt.Errorf("UFFDIO_API: %w", errno)
	}
	if err := unix.Madvise(mem, unix.MADV_DONTNEED); err != nil {
		return err
	}
	reg := [4]uint64{uint64(uintptr(unsafe.Pointer(unsafe.SliceData(mem)))), uint64(len(mem)), uffdRegisterMiss, 0}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, uffdioRegister, uintptr(unsafe.Pointer(&reg))); errno != 0 {
		return fmt.Errorf("UFFDIO_REGISTER: %w", errno)
	}
	return nil
}
