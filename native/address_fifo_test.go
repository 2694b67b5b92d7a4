// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"encoding/binary"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConnectRefusesAPeerWithAnotherShmFIFO: a process whose shared-memory receive FIFO differs
// in size from its peer's (UCX_MM_FIFO_SIZE, ContextConfig.ShmFIFOSize) is refused with
// ErrBadAddress before UCX attaches the peer's FIFO by its own size; one with the same FIFO
// connects. The child connects to this process's worker over posix.
func TestConnectRefusesAPeerWithAnotherShmFIFO(t *testing.T) {
	if v, ok := ProcessEnv("UCX_MM_FIFO_SIZE"); ok {
		t.Skipf("this process runs with UCX_MM_FIFO_SIZE=%s; the test needs UCX's default", v)
	}
	c, err := NewContext(ContextConfig{TLS: "posix,self"})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	w, err := c.NewWorker(WorkerConfig{})
	require.NoError(t, err)
	defer func() { require.NoError(t, w.Close()) }()
	if _, ok := findPosixFIFO(w.Address(), mustHaveName(t, w.Address())); !ok {
		t.Skip("this UCX names its posix FIFO without procfs (UCX_POSIX_USE_PROC_LINK=n)")
	}
	// UCX's default differs by version (64 in 1.13, 256 in 1.22): the child sets this
	// process's size explicitly, or four times it.
	own := shmFIFOSize()
	require.Positive(t, own, "the posix FIFO size of UCX %s", UCXVersion())
	got := connectInChild(t, "posix,self", w.Address(), "UCX_MM_FIFO_SIZE="+strconv.Itoa(own*4))
	require.True(t, strings.HasPrefix(got, "refused:") && strings.Contains(got, "UCX_MM_FIFO_SIZE"), "child: %s", got)
	require.Equal(t, "connected", connectInChild(t, "posix,self", w.Address(), "UCX_MM_FIFO_SIZE="+strconv.Itoa(own)))
	require.Equal(t, "connected", connectInChild(t, "posix,self", w.Address()))
}

// TestFindPosixFIFONamesThisProcess: this process's own worker address names its FIFO as one of
// this process's file descriptors, a file that exists.
func TestFindPosixFIFONamesThisProcess(t *testing.T) {
	c, err := NewContext(ContextConfig{TLS: "posix,self"})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	w, err := c.NewWorker(WorkerConfig{})
	require.NoError(t, err)
	defer func() { require.NoError(t, w.Close()) }()
	f, ok := findPosixFIFO(w.Address(), mustHaveName(t, w.Address()))
	if !ok {
		t.Skip("this UCX names its posix FIFO without procfs (UCX_POSIX_USE_PROC_LINK=n)")
	}
	require.Equal(t, uint64(os.Getpid()), f.pid)
	target, err := os.Readlink(f.path())
	require.NoError(t, err)
	require.Contains(t, target, "ucx_shm_posix", "the FIFO's file")
	require.Nil(t, checkPeerFIFO(w.Address(), w.Address()), "a FIFO is its own size")
}

func mustHaveName(t *testing.T, addr []byte) bool {
	t.Helper()
	withName, err := addressHasName(addr)
	require.NoError(t, err)
	return withName
}

// TestPeerFIFOCheckedOnlyWhereItsPidIsOurs: the FIFO check compares segment sizes only for a
// peer on this host in this pid namespace. A peer address naming another file of this process
// (a segment of another size) is refused; the same address with another host's system id, or
// in another pid namespace, is left to UCX.
func TestPeerFIFOCheckedOnlyWhereItsPidIsOurs(t *testing.T) {
	c, err := NewContext(ContextConfig{TLS: "posix,self"})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	w, err := c.NewWorker(WorkerConfig{})
	require.NoError(t, err)
	defer func() { require.NoError(t, w.Close()) }()
	local := w.Address()
	withName := mustHaveName(t, local)
	mine, ok := findPosixFIFO(local, withName)
	if !ok {
		t.Skip("this UCX names its posix FIFO without procfs (UCX_POSIX_USE_PROC_LINK=n)")
	}
	other, err := os.CreateTemp(t.TempDir(), "fifo")
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, other.Truncate(12345))

	// peer is local with its FIFO pointed at other, and mutate applied to its posix entry.
	peer := func(mutate func(seg []byte, dev []byte)) []byte {
		a := append([]byte(nil), local...)
		seg := a[mine.at : mine.at+8]
		id := binary.LittleEndian.Uint64(seg)
		id = id&^(uint64(1<<posixProcIDBits-1)<<posixProcIDBits) | uint64(other.Fd())<<posixProcIDBits
		binary.LittleEndian.PutUint64(seg, id)
		_ = walkAddressEntries(a, withName, func(e addrEntry) error {
			if e.csum == addrPosixChecksum && mutate != nil {
				mutate(e.iface, e.dev)
			}
			return nil
		})
		return a
	}
	err = checkPeerFIFO(peer(nil), local)
	require.ErrorIs(t, err, ErrBadAddress, "a FIFO of another size")
	require.Contains(t, err.Error(), "UCX_MM_FIFO_SIZE")
	require.NoError(t, checkPeerFIFO(peer(func(_, dev []byte) { dev[0] ^= 1 }), local), "another host")
	require.NoError(t, checkPeerFIFO(peer(func(seg, _ []byte) {
		binary.LittleEndian.PutUint64(seg, binary.LittleEndian.Uint64(seg)^posixSegFlagPIDNS)
	}), local), "another pid namespace")
}
