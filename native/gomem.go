// SPDX-License-Identifier: Apache-2.0

package native

import (
	"unsafe"
)

// findObject is the runtime's own lookup of the heap object holding p (base 0: p is not in
// the Go heap). It is what the runtime uses for cgo's pointer checks; the runtime keeps it
// reachable by linkname for callers outside the standard library.
//
//go:linkname findObject runtime.findObject
func findObject(p, refBase, refOff uintptr) (base uintptr, s unsafe.Pointer, objIndex uintptr)

// IsGoHeap reports whether any byte of [p, p+n) lies in an object of the Go heap: memory the
// garbage collector owns, which cgo's pointer rules forbid C code, and so UCX, to keep after a
// call returns (the collector may free it once Go holds no reference, and UCX registrations
// and gets outlive every call). Memory from mmap, C's malloc, cudaMalloc or UCX is not in
// the Go heap. The first and last bytes are checked: a heap object never straddles memory
// that is not the heap. Go's global variables (data and bss) are not detected.
func IsGoHeap(p unsafe.Pointer, n int64) bool {
	if p == nil || n <= 0 {
		return false
	}
	first := uintptr(p)
	last := first + uintptr(n-1)
	b1, _, _ := findObject(first, 0, 0)
	b2, _, _ := findObject(last, 0, 0)
	return b1 != 0 || b2 != 0
}
