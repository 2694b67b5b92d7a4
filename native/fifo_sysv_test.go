// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"context"
	"encoding/binary"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// testSegment makes a System V segment of n bytes whose FIFO control block names owner as
// its reader (0: all zeros; none where it is too small to hold one), removed when the test
// ends.
func testSegment(t *testing.T, n int, owner int32) int {
	t.Helper()
	id, err := unix.SysvShmGet(unix.IPC_PRIVATE, n, unix.IPC_CREAT|0o600)
	require.NoError(t, err)
	b, err := unix.SysvShmAttach(id, 0, 0)
	require.NoError(t, err)
	if n >= fifoPIDOffset+4 {
		binary.LittleEndian.PutUint32(b[fifoPIDOffset:], uint32(owner))
	}
	require.NoError(t, unix.SysvShmDetach(b))
	t.Cleanup(func() { _, _ = unix.SysvShmCtl(id, unix.IPC_RMID, nil) })
	return id
}

// withSysvSegment returns addr with the sysv FIFO's segment id replaced by id.
func withSysvSegment(t *testing.T, addr []byte, id uint64) []byte {
	t.Helper()
	f, ok := findSysvFIFO(addr, mustHaveName(t, addr))
	require.True(t, ok)
	out := append([]byte(nil), addr...)
	binary.LittleEndian.PutUint64(out[f.at:], id)
	return out
}

// The layout is UCX's: this process's own sysv FIFO, recorded as a peer's would be (its
// address's shmid, the kernel's word for who made the segment), holds this pid where
// kvx_ucx_mm_fifo_release reads it, UCX maps it besides the record's own attachment, and an
// idle FIFO's counters are equal.
func TestRecordPeerSysvFIFO_ReadsTheLayoutOfThisUCX(t *testing.T) {
	w := tlsWorker(t, "sysv,self")
	seg := recordPeerSysvFIFO(w.Address(), w.Address())
	require.NotNil(t, seg, "this worker's own sysv FIFO")
	defer seg.close()
	require.Equal(t, os.Getpid(), seg.pid)
	require.Equal(t, "sysv", seg.transport)
	require.False(t, seg.gone())
	maps, err := seg.segMappings()
	require.NoError(t, err)
	require.NotEmpty(t, maps, "UCX maps its own FIFO segment (the record's attachment left out)")
	for _, m := range maps {
		require.NotEqual(t, mappingOf(seg.shm).base, m.base, "the record's own attachment is not UCX's")
	}
	size := uint64(shmFIFOSize())
	require.NotZero(t, size)
	_, ok := fifoRelease(mappingOf(seg.shm), os.Getpid()+1, size)
	require.False(t, ok, "another pid's block")
	n, ok := fifoRelease(mappingOf(seg.shm), os.Getpid(), size)
	require.True(t, ok, "the pid where UCX keeps it, counters no more than %d apart", size)
	require.Zero(t, n, "an idle FIFO: everything sent to it was read")
}

// The segment a peer's address names is kept only if the kernel says the process whose FIFO
// its control block holds made it, on this host: a segment whose block names nobody or
// another process, one that does not exist, and a device address of another host are not
// recorded, so nothing of them is ever written.
func TestRecordPeerSysvFIFO_OnlyAFIFOOfTheProcessThatMadeIt(t *testing.T) {
	w := tlsWorker(t, "sysv,self")
	local := w.Address()
	gone := testSegment(t, 4096, int32(os.Getpid()))
	_, err := unix.SysvShmCtl(gone, unix.IPC_RMID, nil)
	require.NoError(t, err)
	otherHost := append([]byte(nil), local...) // the sysv device's address (the host's id) changed
	require.NoError(t, walkAddressEntries(otherHost, mustHaveName(t, local), func(e addrEntry) error {
		if e.csum == addrSysvChecksum {
			require.NotEmpty(t, e.dev)
			e.dev[len(e.dev)-1] ^= 0xff // e.dev is otherHost's bytes
		}
		return nil
	}))

	for _, c := range []struct {
		name string
		addr []byte
		want bool
	}{
		{"this worker's own FIFO", local, true},
		{"a segment whose block names its maker", withSysvSegment(t, local, uint64(testSegment(t, 4096, int32(os.Getpid())))), true},
		{"a segment whose block names nobody", withSysvSegment(t, local, uint64(testSegment(t, 4096, 0))), false},
		{"a segment whose block names another process", withSysvSegment(t, local, uint64(testSegment(t, 4096, 1))), false},
		{"a segment smaller than a control block", withSysvSegment(t, local, uint64(testSegment(t, 128, int32(os.Getpid())))), false},
		{"no such segment", withSysvSegment(t, local, uint64(gone)), false},
		{"not a shmid", withSysvSegment(t, local, 1<<40), false},
		{"another host", otherHost, false},
	} {
		seg := recordPeerSysvFIFO(c.addr, local)
		require.Equal(t, c.want, seg != nil, c.name)
		seg.close()
	}
}

// An endpoint to a local peer holds the peer's sysv FIFO attached (so that it still exists to
// be emptied once the peer is dead) and lets go of it with the endpoint: connecting and
// closing leaves no attachment behind.
func TestPeerSysvFIFO_HeldOnlyWhileTheEndpointLives(t *testing.T) {
	p := newPairConfig(t, ContextConfig{TLS: "sysv,self"})
	f, ok := findSysvFIFO(p.b.Address(), mustHaveName(t, p.b.Address()))
	require.True(t, ok)
	attached := func() int {
		var ds unix.SysvShmDesc
		_, err := unix.SysvShmCtl(f.shmid, unix.IPC_STAT, &ds)
		require.NoError(t, err)
		return int(ds.Nattch)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before := attached()
	var eps []*Endpoint
	for range 20 {
		ep, err := p.a.Connect(ctx, p.b.Address())
		require.NoError(t, err)
		eps = append(eps, ep)
	}
	require.GreaterOrEqual(t, attached(), before+20, "each endpoint holds the peer's FIFO")
	for _, ep := range eps {
		require.NoError(t, ep.Close(ctx))
	}
	require.Eventually(t, func() bool { return attached() == before }, 5*time.Second, 10*time.Millisecond,
		"attachments of the peer's FIFO left after the endpoints closed: %d, %d before", attached(), before)
}

// The watch treats a sysv record as a posix one: it empties it once its process is gone,
// drops it once UCX no longer maps the segment (the record's own attachment does not count),
// and keeps a live peer's.
func TestFIFOWatch_SysvEmptiesTheDeadDropsTheUnmappedKeepsTheLive(t *testing.T) {
	w := tlsWorker(t, "sysv,self")
	live := recordPeerSysvFIFO(w.Address(), w.Address()) // this process's own FIFO: UCX maps it, alive
	require.NotNil(t, live)
	defer live.close()
	dead := recordPeerSysvFIFO(w.Address(), w.Address())
	require.NotNil(t, dead)
	dead.started++ // the same segment, as if its pid now named another process
	unmapped := recordPeerSysvFIFO(withSysvSegment(t, w.Address(), uint64(testSegment(t, 4096, int32(os.Getpid())))), w.Address())
	require.NotNil(t, unmapped, "a segment only the record attached")

	var f fifoWatch
	f.add(live)
	f.add(dead)
	f.add(unmapped)
	var emptied []*peerFIFOSeg
	f.poll(func(s *peerFIFOSeg) { emptied = append(emptied, s) })
	require.Equal(t, []*peerFIFOSeg{dead}, emptied)
	require.Equal(t, []*peerFIFOSeg{live}, f.segs, "the live one stays watched")
	require.Nil(t, dead.shm, "let go of once emptied")
	require.Nil(t, unmapped.shm, "let go of once UCX no longer maps it")
}
