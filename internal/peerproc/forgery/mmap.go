// SPDX-License-Identifier: Apache-2.0

package forgery

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// MapAt maps n bytes of fresh memory at addr exactly (MAP_FIXED_NOREPLACE: never over a
// mapping that is there), or anywhere when addr is 0. Unmap it with unix.Munmap.
func MapAt(addr uintptr, n int) ([]byte, error) {
	flags := unix.MAP_ANON | unix.MAP_PRIVATE
	if addr != 0 {
		flags |= unix.MAP_FIXED_NOREPLACE
	}
	p, _, errno := unix.Syscall6(unix.SYS_MMAP, addr, uintptr(n), unix.PROT_READ|unix.PROT_WRITE, uintptr(flags), ^uintptr(0), 0)
	if errno != 0 {
		return nil, fmt.Errorf("mmap at %#x: %w", addr, errno)
	}
	if addr != 0 && p != addr {
		_, _, _ = unix.Syscall(unix.SYS_MUNMAP, p, uintptr(n), 0)
		return nil, fmt.Errorf("mmap at %#x landed at %#x", addr, p)
	}
	return unsafe.Slice(*(**byte)(unsafe.Pointer(&p)), n), nil
}
