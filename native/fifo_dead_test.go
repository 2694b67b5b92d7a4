// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseProcStat_TakesStateAndStartTimeAfterTheName(t *testing.T) {
	// Field 22 is the start time; the name may hold spaces and parentheses.
	line := "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 10000 200 18446744073709551615\n"
	started, state, err := parseProcStat([]byte(line))
	require.NoError(t, err)
	require.Equal(t, byte('S'), state)
	require.Equal(t, uint64(987654), started)

	for _, bad := range []string{"", "4242 no name S 1", "4242 (x) S 1 2 3", "4242 (x) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 notanumber 1"} {
		_, _, err := parseProcStat([]byte(bad))
		require.ErrorIs(t, err, ErrInvalidArgument, "%q", bad)
	}
}

func TestParseMaps_FindsTheSegmentByDeviceInodeAndOffset(t *testing.T) {
	dev := uint64(0x1a) // 00:1a, a tmpfs
	maps := strings.Join([]string{
		"7f0000000000-7f0000021000 rw-s 00000000 00:1a 4711 /dev/shm/ucx_shm_posix_1 (deleted)",
		"7f0000100000-7f0000121000 rw-s 00001000 00:1a 4711 /dev/shm/ucx_shm_posix_1 (deleted)",  // not from its first byte
		"7f0000200000-7f0000221000 rw-s 00000000 00:1b 4711 /other/fs/file",                      // another device
		"7f0000300000-7f0000321000 rw-s 00000000 00:1a 47110 /dev/shm/ucx_shm_posix_2 (deleted)", // another inode
		"garbage",
		"7f0000400000-7f0000421000 rw-s 00000000 00:1a 4711",
	}, "\n")
	got, err := parseMaps(strings.NewReader(maps), dev, 4711)
	require.NoError(t, err)
	require.Equal(t, []mapping{{0x7f0000000000, 0x21000}, {0x7f0000400000, 0x21000}}, got)

	// A large device number: major 259, minor 300 ("103:12c").
	big := uint64(300&0xff) | uint64(259)<<8 | uint64(300&^0xff)<<12
	require.Equal(t, uint64(259), devMajor(big))
	require.Equal(t, uint64(300), devMinor(big))
	got, err = parseMaps(strings.NewReader("1000-3000 rw-s 00000000 103:12c 9 /x"), big, 9)
	require.NoError(t, err)
	require.Equal(t, []mapping{{0x1000, 0x2000}}, got)
}

// procState waits for pid's /proc state to become want.
func procState(t *testing.T, pid int, want byte) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, st, err := procStat(pid)
		return err == nil && st == want
	}, 10*time.Second, time.Millisecond, "pid %d never in state %c", pid, want)
}

// Only a process that ended counts as gone: a stopped (frozen) one is alive, since it reads its
// FIFO again when it resumes; a zombie, a reaped one, and a pid that now names a process
// started at another time are gone.
func TestPeerFIFOSeg_GoneOnlyOnceTheProcessEnded(t *testing.T) {
	started, state, err := procStat(os.Getpid())
	require.NoError(t, err)
	require.NotEqual(t, byte('Z'), state)
	self := &peerFIFOSeg{pid: os.Getpid(), started: started}
	require.False(t, self.gone(), "this process")
	require.True(t, (&peerFIFOSeg{pid: os.Getpid(), started: started + 1}).gone(), "a pid another process holds now")

	cmd := exec.Command("sleep", "60")
	require.NoError(t, cmd.Start())
	pid := cmd.Process.Pid
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	started, _, err = procStat(pid)
	require.NoError(t, err)
	s := &peerFIFOSeg{pid: pid, started: started}
	require.False(t, s.gone(), "running")

	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	procState(t, pid, 'T')
	require.False(t, s.gone(), "stopped: it resumes and reads its FIFO")

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	procState(t, pid, 'Z')
	require.True(t, s.gone(), "a zombie runs nothing any more")
	_ = cmd.Wait()
	require.True(t, s.gone(), "reaped")
}

// fakeFIFO maps a page holding a FIFO control block of pid with the given head and tail.
func fakeFIFO(t *testing.T, pid int32, head, tail uint64) (mapping, []byte) {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Munmap(b) })
	binary.LittleEndian.PutUint64(b[0:], head)
	binary.LittleEndian.PutUint64(b[128:], tail)
	binary.LittleEndian.PutUint32(b[136:], uint32(pid))
	return mappingOf(b), b
}

// tlsWorker opens a context over tls ("posix,self", "sysv,self") and a worker on it, closed
// when the test ends.
func tlsWorker(t *testing.T, tls string) *Worker {
	t.Helper()
	uc, err := NewContext(ContextConfig{TLS: tls})
	require.NoError(t, err)
	w, err := uc.NewWorker(WorkerConfig{})
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, w.Close())
		require.NoError(t, uc.Close())
	})
	return w
}

// The FIFO's tail moves to its head (the reader's wake-up bit left out) only in the control
// block of the dead pid whose counters are those of a FIFO of that size; anything else stays.
func TestFIFORelease_OnlyTheDeadPidsBlockAndOnlyPlausibleCounters(t *testing.T) {
	const armed = uint64(1) << 63
	m, b := fakeFIFO(t, 4242, armed|1000, 800)
	n, ok := fifoRelease(m, 4242, 256)
	require.True(t, ok)
	require.Equal(t, uint64(200), n)
	require.Equal(t, uint64(1000), binary.LittleEndian.Uint64(b[128:]), "tail at head")
	require.Equal(t, armed|1000, binary.LittleEndian.Uint64(b[0:]), "head untouched")

	for name, c := range map[string]struct {
		pid        int32
		head, tail uint64
		size       uint64
		short      bool
	}{
		"another pid":               {pid: 4243, head: 1000, tail: 800, size: 256},
		"more unread than it holds": {pid: 4242, head: 1000, tail: 700, size: 256},
		"tail past head":            {pid: 4242, head: 800, tail: 1000, size: 256},
		"no FIFO size":              {pid: 4242, head: 1000, tail: 800, size: 0},
		"shorter than a block":      {pid: 4242, head: 1000, tail: 800, size: 256, short: true},
	} {
		m, b := fakeFIFO(t, 4242, c.head, c.tail)
		if c.short {
			m.len = 136
		}
		_, ok := fifoRelease(m, int(c.pid), c.size)
		require.False(t, ok, name)
		require.Equal(t, c.tail, binary.LittleEndian.Uint64(b[128:]), "%s: tail untouched", name)
	}
	_, ok = fifoRelease(mapping{m.base + 8, m.len - 8}, 4242, 256)
	require.False(t, ok, "not at a cache line")
}

// The layout is UCX's: this process's own FIFO, found as a peer's would be (its address, its
// segment's device and inode, this process's mappings), holds this pid where
// kvx_ucx_mm_fifo_release reads it, and an idle FIFO's counters are equal.
func TestFIFORelease_ReadsTheLayoutOfThisUCX(t *testing.T) {
	w := tlsWorker(t, "posix,self")
	seg := recordPeerFIFO(w.Address(), w.Address())
	require.NotNil(t, seg, "this UCX names its posix FIFO through procfs")
	require.Equal(t, os.Getpid(), seg.pid)
	require.False(t, seg.gone())
	defer seg.close()
	maps, err := seg.segMappings()
	require.NoError(t, err)
	require.NotEmpty(t, maps, "UCX maps its own FIFO segment")
	size := uint64(shmFIFOSize())
	require.NotZero(t, size)
	b, err := seg.mapSeg()
	require.NoError(t, err)
	defer func() { require.NoError(t, syscall.Munmap(b)) }()
	m := mappingOf(b)
	_, ok := fifoRelease(m, os.Getpid()+1, size)
	require.False(t, ok, "another pid's block")
	n, ok := fifoRelease(m, os.Getpid(), size)
	require.True(t, ok, "the pid where UCX keeps it, counters no more than %d apart", size)
	require.Zero(t, n, "an idle FIFO: everything sent to it was read")
	idx, head, ok := fifoUnwritten(m, os.Getpid(), size, uint64(shmFIFOElemSize()))
	require.True(t, ok)
	require.Equal(t, head, idx, "every element claimed is written")
}

// The watch empties a watched FIFO once its process is gone, drops an entry whose segment this
// process no longer maps (UCX let go: the peer resumed), keeps one of a live peer, and looks
// at most every fifoWatchEvery.
func TestFIFOWatch_EmptiesTheDeadDropsTheUnmappedKeepsTheLive(t *testing.T) {
	w := tlsWorker(t, "posix,self")
	live := recordPeerFIFO(w.Address(), w.Address()) // this process's own FIFO: mapped, alive
	require.NotNil(t, live)
	defer live.close()
	dead := *live
	dead.started++ // the same segment, as if its pid now named another process
	unmapped := *live
	unmapped.ino += 1 << 40 // no file of this process (the next inodes may be UCX's other segments)

	var f fifoWatch
	f.add(live)
	f.add(&dead)
	f.add(&unmapped)
	var emptied []*peerFIFOSeg
	release := func(s *peerFIFOSeg) { emptied = append(emptied, s) }
	f.poll(release)
	require.Equal(t, []*peerFIFOSeg{&dead}, emptied)
	require.Equal(t, []*peerFIFOSeg{live}, f.segs, "the live one stays watched")
	f.add(&dead)
	f.poll(release)
	require.Len(t, emptied, 1, "not before fifoWatchEvery")
	f.next = time.Time{}
	f.poll(release)
	require.Len(t, emptied, 2)
}

// segFDs counts this process's descriptors open on the file with device dev and inode ino.
func segFDs(t *testing.T, dev, ino uint64) int {
	t.Helper()
	d, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, e := range d {
		var st syscall.Stat_t
		if syscall.Stat("/proc/self/fd/"+e.Name(), &st) == nil && uint64(st.Dev) == dev && st.Ino == ino {
			n++
		}
	}
	return n
}

// An endpoint to a local peer holds the peer's FIFO segment open (a dead process's descriptors
// cannot be reached later) and lets go of it with the endpoint: connecting and closing leaves
// no descriptor on it behind.
func TestPeerFIFOSeg_HeldOnlyWhileTheEndpointLives(t *testing.T) {
	p := newPairConfig(t, ContextConfig{TLS: "posix,self"})
	seg := recordPeerFIFO(p.b.Address(), p.a.Address())
	if seg == nil {
		t.Skip("this UCX names its posix FIFO without procfs, or lays it out otherwise")
	}
	seg.close()
	// No collection meanwhile: an *os.File the endpoint forgot would be closed by its
	// finalizer, and the leak would pass for a release.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before := segFDs(t, seg.dev, seg.ino)
	var eps []*Endpoint
	for range 20 {
		ep, err := p.a.Connect(ctx, p.b.Address())
		require.NoError(t, err)
		eps = append(eps, ep)
	}
	require.Equal(t, before+20, segFDs(t, seg.dev, seg.ino), "each endpoint holds the peer's FIFO")
	for _, ep := range eps {
		require.NoError(t, ep.Close(ctx))
	}
	require.Eventually(t, func() bool { return segFDs(t, seg.dev, seg.ino) == before }, 5*time.Second, 10*time.Millisecond,
		"descriptors on the peer's FIFO left after the endpoints closed: %d, %d before", segFDs(t, seg.dev, seg.ino), before)
}

// The FIFO is read and written only under a UCX whose layout it was read from.
func TestFIFOLayoutKnown_OnlyTheReleasesReadFrom(t *testing.T) {
	for v, want := range map[string]bool{"1.13.1": true, "1.22.0": true, "1.17.0": true, "1.12.1": false,
		"1.23.0": false, "2.0.0": false, "": false, "x.y": false, "1": false} {
		require.Equal(t, want, fifoLayoutKnown(v), v)
	}
	require.True(t, fifoLayoutKnown(UCXVersion()), "the UCX these tests run against (%s)", UCXVersion())
}

// The pid and descriptor a peer's address names are checked before the file is kept: a file of
// that process outside the device UCX's own FIFO segment is on (here a file on disk this
// process has open) is not recorded, so nothing of it is ever written; this process's own FIFO
// named the same way is.
func TestRecordPeerFIFO_OnlyASegmentOnTheDeviceOfOurOwn(t *testing.T) {
	w := tlsWorker(t, "posix,self")
	local := w.Address()
	withName := mustHaveName(t, local)
	mine, ok := findPosixFIFO(local, withName)
	if !ok {
		t.Skip("this UCX names its posix FIFO without procfs (UCX_POSIX_USE_PROC_LINK=n)")
	}
	other, err := os.CreateTemp(t.TempDir(), "not-a-fifo")
	require.NoError(t, err)
	defer other.Close()
	var a, b syscall.Stat_t
	require.NoError(t, syscall.Stat(mine.path(), &a))
	require.NoError(t, syscall.Fstat(int(other.Fd()), &b))
	if a.Dev == b.Dev {
		t.Skip("the temporary directory is on UCX's shared-memory device")
	}
	addr := append([]byte(nil), local...)
	seg := addr[mine.at : mine.at+8]
	id := binary.LittleEndian.Uint64(seg)
	id = id&^(uint64(1<<posixProcIDBits-1)<<posixProcIDBits) | uint64(other.Fd())<<posixProcIDBits
	binary.LittleEndian.PutUint64(seg, id)
	require.Nil(t, recordPeerFIFO(addr, local), "a file on another device")
	own := recordPeerFIFO(local, local)
	require.NotNil(t, own, "this process's own FIFO segment")
	own.close()
}
