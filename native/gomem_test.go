// SPDX-License-Identifier: Apache-2.0

package native

import (
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// IsGoHeap tells memory the Go collector owns from memory mapped outside it, which is what
// lets a registration refuse Go memory before UCX sees it.
func TestIsGoHeap(t *testing.T) {
	heap := make([]byte, 1<<20)
	small := new([64]byte)
	mapped, err := syscall.Mmap(-1, 0, 1<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	defer func() { _ = syscall.Munmap(mapped) }()
	cases := []struct {
		desc string
		p    unsafe.Pointer
		n    int64
		want bool
	}{
		{"a 1 MiB Go slice", unsafe.Pointer(&heap[0]), int64(len(heap)), true},
		{"the tail of a Go slice", unsafe.Pointer(&heap[len(heap)-10]), 10, true},
		{"a small Go object", unsafe.Pointer(small), 64, true},
		{"anonymous mmap", unsafe.Pointer(&mapped[0]), int64(len(mapped)), false},
		{"nil", nil, 10, false},
		{"empty range", unsafe.Pointer(&heap[0]), 0, false},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			require.Equal(t, c.want, IsGoHeap(c.p, c.n))
		})
	}
}
