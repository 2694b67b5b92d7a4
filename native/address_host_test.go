// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// addrPrintEnv makes TestAddressPrintChild print its worker address.
const addrPrintEnv = "KVX_ADDRESS_PRINT_CHILD"

// TestAddressPrintChild is the child of TestAddressInfo_NamesTheProcess: it prints its pid and
// its worker's address and exits.
func TestAddressPrintChild(t *testing.T) {
	if _, ok := os.LookupEnv(addrPrintEnv); !ok {
		t.Skip("run by TestAddressInfo_NamesTheProcess only")
	}
	c, err := NewContext(ContextConfig{TLS: "posix,cma,self"})
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	w, err := c.NewWorker(WorkerConfig{})
	require.NoError(t, err)
	defer func() { _ = w.Close() }()
	fmt.Printf("CHILD: %d %x\n", os.Getpid(), w.Address())
}

// ownPIDNamespace is what a cma address carries as this process's pid namespace: 0 in the
// initial one (inode 0xeffffffc, PROC_PID_INIT_INO), else the namespace's inode.
func ownPIDNamespace(t *testing.T) uint64 {
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat("/proc/self/ns/pid", &st))
	if st.Ino == 0xeffffffc {
		return 0
	}
	return st.Ino
}

// A worker address names the process that made it: this process's own address gives
// os.Getpid(), a child's gives the child's pid on the same host, and an address without cma
// (tcp) or one this UCX cannot read gives nothing.
func TestAddressInfo_NamesTheProcess(t *testing.T) {
	addrOf := func(tls string) []byte {
		c, err := NewContext(ContextConfig{TLS: tls})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		w, err := c.NewWorker(WorkerConfig{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = w.Close() })
		return w.Address()
	}
	self := addrOf("posix,cma,self")
	own, ok := AddressInfo(self, self)
	require.True(t, ok, "this process's own address carries cma")
	require.Equal(t, os.Getpid(), own.PID)
	require.Equal(t, ownPIDNamespace(t), own.PIDNamespace)
	require.NotEmpty(t, own.SystemID)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestAddressPrintChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), addrPrintEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	var pid int
	var hexAddr string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "CHILD: ") {
			_, err = fmt.Sscanf(line, "CHILD: %d %s", &pid, &hexAddr)
			require.NoError(t, err)
		}
	}
	child, err := hex.DecodeString(hexAddr)
	require.NoError(t, err, "%s", out)
	got, ok := AddressInfo(child, self)
	require.True(t, ok)
	require.Equal(t, pid, got.PID, "the child's own pid")
	require.NotEqual(t, os.Getpid(), got.PID)
	require.True(t, own.SameProcessSpace(got), "one host, one pid namespace")

	for _, c := range []struct {
		desc string
		addr []byte
	}{
		{"tcp carries no cma entry", addrOf("tcp,self")},
		{"cut short", self[:len(self)-1]},
		{"empty", nil},
	} {
		_, ok := AddressInfo(c.addr, self)
		require.False(t, ok, c.desc)
	}
	other := own
	other.SystemID = "elsewhere"
	require.False(t, own.SameProcessSpace(other), "another host")
	other = own
	other.PIDNamespace++
	require.False(t, own.SameProcessSpace(other), "another pid namespace")
}

// A key to memory UCX allocated is mapped over shared memory (posix attaches it), a key to
// memory the caller registered is not (UCX would emulate gets through it), and over TCP
// neither is.
func TestRemoteKey_MappedOnlyForAllocatedSharedMemory(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			p := newPair(t, tr.tls)
			allocated := alloc(t, p.ctxB, 1<<20)
			mm, err := syscall.Mmap(-1, 0, 1<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
			require.NoError(t, err)
			t.Cleanup(func() { _ = syscall.Munmap(mm) })
			registered, err := p.ctxB.Register(unsafe.Pointer(&mm[0]), int64(len(mm)), MemoryHost)
			require.NoError(t, err)
			t.Cleanup(func() { _ = registered.Close() })
			for _, c := range []struct {
				desc string
				mem  *Memory
				want bool
			}{
				{"allocated", allocated, tr.name == "shm"},
				{"registered", registered, false},
			} {
				packed, err := c.mem.PackRemoteKey()
				require.NoError(t, err)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				rk, err := p.ab.UnpackRemoteKey(ctx, packed)
				cancel()
				require.NoError(t, err)
				require.Equal(t, c.want, rk.Mapped(), c.desc)
				rk.Close()
			}
		})
	}
}

// A mapped key shows the peer's memory in this process: View reads what the peer wrote, and
// sees the peer's later writes; a key that is not mapped has no view.
func TestRemoteKey_ViewShowsThePeersMemory(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			p := newPair(t, tr.tls)
			m := alloc(t, p.ctxB, 1<<20)
			b := m.Bytes()
			for i := range b {
				b[i] = byte(i * 7)
			}
			packed, err := m.PackRemoteKey()
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			rk, err := p.ab.UnpackRemoteKey(ctx, packed)
			cancel()
			require.NoError(t, err)
			defer rk.Close()
			v, err := rk.View(m.Addr()+4096, 8192)
			require.NoError(t, err)
			if tr.name != "shm" {
				require.Nil(t, v, "a key over %s maps nothing here", tr.name)
				return
			}
			require.Len(t, v, 8192)
			require.Equal(t, b[4096:4096+8192], v)
			b[4096] = 0xaa
			require.Equal(t, byte(0xaa), v[0], "the view is the peer's memory, not a copy")
			v, err = rk.View(m.Addr(), 0)
			require.NoError(t, err)
			require.Nil(t, v, "an empty view")
		})
	}
}
