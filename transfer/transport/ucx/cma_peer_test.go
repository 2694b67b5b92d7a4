// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

// Two-process tests of the process_vm_readv route against a peer that lies: a child process
// (this test binary, started with cmaChildArg) registers a pool with its own UCX transport and
// answers as a peer would, and the tests feed its address, key and ranges to this process's
// transport with lies in them. docs/security.md, "Same-host reads (process_vm_readv)", says
// what each holds.

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/internal/peerproc"
	"github.com/kvxfer/kvxfer/internal/peerproc/uffd"
	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/internal/vectorget"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// cmaChildArg, as the test binary's first argument, runs it as a child of these tests
// (runCMAChild) instead of running tests.
const cmaChildArg = "kvxfer-cma-child"

// The bytes a child writes where no read may reach: an unrelated process's memory (canary) and
// the peer's own memory outside its registration (secret).
const (
	cmaCanary = 0xC5
	cmaSecret = 0x5E
)

// mapAt maps n bytes of anonymous memory at addr (0: where the kernel likes), never over a
// mapping already there.
func mapAt(addr uintptr, n int) ([]byte, error) {
	flags := unix.MAP_ANON | unix.MAP_PRIVATE
	if addr != 0 {
		flags |= unix.MAP_FIXED_NOREPLACE
	}
	p, _, errno := unix.Syscall6(unix.SYS_MMAP, addr, uintptr(n), unix.PROT_READ|unix.PROT_WRITE, uintptr(flags), ^uintptr(0), 0)
	if errno != 0 {
		return nil, fmt.Errorf("mmap at %#x: %w", addr, errno)
	}
	if addr != 0 && p != addr {
		return nil, fmt.Errorf("mmap at %#x landed at %#x", addr, p)
	}
	return unsafe.Slice(*(**byte)(unsafe.Pointer(&p)), n), nil
}

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

// canaryAt maps n bytes in this process at an address a child can map too: a child maps its
// pool (or a canary) at the same addresses with MAP_FIXED_NOREPLACE, which fails with EEXIST
// ("file exists") if anything of the child's lies there. An address the kernel picked here
// lies where the kernel puts a process's own mappings (shared libraries, thread stacks, UCX's
// segments), and a child's lie in the same window; this one is picked at random, 2 MiB aligned,
// between 80 and 96 TiB, far below where the kernel maps anything of either process (its
// mappings grow down from near 128 TiB) and clear of the race detector's fixed ranges (below
// 64 TiB).
func canaryAt(t *testing.T, n int) []byte {
	t.Helper()
	const lo, span, align = 0x5000_0000_0000, 0x1000_0000_0000, 2 << 20
	for range 64 {
		addr := uintptr(lo + rand.Uint64N(span/align)*align)
		mem, err := mapAt(addr, n)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		require.NoError(t, err)
		t.Cleanup(func() { _ = unix.Munmap(mem) })
		return mem
	}
	require.FailNow(t, "no free address for the canary in 64 tries")
	return nil
}

// runCMAChild is the child's main. Modes (each prints its lines, then waits for stdin to close):
//
//	canary <addr> <n>: n bytes of cmaCanary at addr; prints "ADDR none"
//	pool <n> <seed> <base>: a UCX transport over shared memory; 2n bytes mapped at base (0:
//	   anywhere), the first n cmaSecret, the last n registered and filled with seed; prints
//	   "ADDR <worker>", "POOL <addr> <n> <key>", "SECRET <addr>"
//	uffd <n> <seed>: as pool, but all 2n bytes registered and the last n backed by a
//	   userfaultfd nobody serves: a read there blocks until this process exits; prints
//	   "ADDR <worker>", "POOL <addr> <2n> <key>"
func runCMAChild(args []string) int {
	fail := func(err error) int {
		fmt.Println("ERR", err)
		return 1
	}
	num := func(i int) uint64 {
		v, _ := strconv.ParseUint(args[i], 0, 64)
		return v
	}
	switch args[0] {
	case "canary":
		mem, err := mapAt(uintptr(num(1)), int(num(2)))
		if err != nil {
			return fail(err)
		}
		for i := range mem {
			mem[i] = cmaCanary
		}
		fmt.Println("ADDR none")
	case "pool", "uffd":
		n := int(num(1))
		base := uintptr(0)
		if args[0] == "pool" {
			base = uintptr(num(3))
		}
		mem, err := mapAt(base, 2*n)
		if err != nil {
			return fail(err)
		}
		tr, err := newTransport(Config{TLS: "posix,cma,self", StagingBytes: 1 << 20, ProbeInterval: -1})
		if err != nil {
			return fail(err)
		}
		if err := tr.Bind(nopInbound{}); err != nil {
			return fail(err)
		}
		pool := mem[n:]
		if args[0] == "uffd" {
			pool = mem
		}
		r, err := tr.RegisterHost(pool)
		if err != nil {
			return fail(err)
		}
		fill(mem[:n], byte(num(2)))
		if args[0] == "pool" {
			for i := range n {
				mem[i] = cmaSecret
			}
			fill(pool, byte(num(2)))
		} else if err := uffd.Block(mem[n:]); err != nil {
			return fail(err)
		}
		addr, key := r.remoteKey()
		fmt.Println("ADDR " + hex.EncodeToString(tr.WorkerAddress()))
		fmt.Printf("POOL %#x %d %s\n", addr, len(pool), hex.EncodeToString(key))
		fmt.Printf("SECRET %#x\n", addrOf(mem))
	default:
		return fail(fmt.Errorf("unknown mode %q", args[0]))
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// cmaChild is a running child with what it printed.
type cmaChild struct {
	*peerproc.Proc
	pool, secret uint64
	size         int
	key          []byte
}

func startCMAChild(t *testing.T, args ...string) *cmaChild {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	c := &cmaChild{Proc: peerproc.Start(t, exe, append([]string{cmaChildArg}, args...)...)}
	if args[0] == "canary" {
		return c
	}
	f := strings.Fields(c.Expect(t, "POOL ", 20*time.Second))
	require.Len(t, f, 3)
	c.pool, err = strconv.ParseUint(f[0], 0, 64)
	require.NoError(t, err)
	c.size, err = strconv.Atoi(f[1])
	require.NoError(t, err)
	c.key, err = hex.DecodeString(f[2])
	require.NoError(t, err)
	c.secret, err = strconv.ParseUint(c.Expect(t, "SECRET ", 20*time.Second), 0, 64)
	require.NoError(t, err)
	return c
}

// cmaReader is this process's side: a transport over shared memory that reads into a
// registered buffer of n bytes.
func cmaReader(t *testing.T, n int, cfg Config) (*ucxTransport, *ucxRecorder, []byte) {
	t.Helper()
	dstMem := mmapRegion(t, n)
	cfg.TLS, cfg.StagingBytes, cfg.ProbeInterval = "posix,cma,self", 1<<20, -1
	if cfg.CloseTimeout == 0 {
		// Close waits this long (and a second) for the worker to stop: 2 s failed at load 15
		// under -race ("worker did not stop within 3s") with nothing left to settle.
		cfg.CloseTimeout = 20 * time.Second
	}
	b, err := newTransport(cfg)
	require.NoError(t, err)
	rb := newUCXRecorder()
	require.NoError(t, b.Bind(rb))
	return b, rb, registered(t, b, dstMem)
}

// getFrom posts one get of dst's length at addr of peer's pool into dst.
func getFrom(t *testing.T, b *ucxTransport, rb *ucxRecorder, peer transport.Peer, key []byte, addr uint64, dst []byte) (transport.OpID, error) {
	t.Helper()
	return post(t, rb, func(d func(transport.Completion)) (transport.OpID, error) {
		return b.PostGet(peer, transport.Tag{Request: 7, Seq: 1}, key, addr, dst, d)
	})
}

// forgePID is peer's worker address with its cma entry's pid replaced by pid: what a peer
// that names another process sends. self is the reader's address (the layout to parse).
func forgePID(t *testing.T, self []byte, peer string, pid int) transport.Peer {
	t.Helper()
	addr, err := hex.DecodeString(peer)
	require.NoError(t, err)
	real, ok := native.AddressInfo(addr, self)
	require.True(t, ok, "the child's address has a cma entry")
	for i := 0; i+4 <= len(addr); i++ {
		v := binary.LittleEndian.Uint32(addr[i:])
		if int(v&^(1<<31)) != real.PID {
			continue
		}
		forged := bytes.Clone(addr)
		binary.LittleEndian.PutUint32(forged[i:], v&(1<<31)|uint32(pid))
		if h, ok := native.AddressInfo(forged, self); ok && h.PID == pid && h.SameProcessSpace(real) {
			return PeerFromAddress(forged)
		}
	}
	require.FailNow(t, "no cma pid in the child's address")
	return ""
}

// holds reports whether b has a run of 64 bytes equal to v.
func holds(b []byte, v byte) bool { return bytes.Contains(b, bytes.Repeat([]byte{v}, 64)) }

// A peer whose worker address names another process (a third process with a canary at the
// pool's very addresses, or this process itself, which needs no ptrace right to read) is never
// read with process_vm_readv: the get goes through UCX, reading the real peer's pool, and no
// canary byte lands in the destination.
func TestCMA_ForgedPIDIsNeverRead(t *testing.T) {
	const n = 1 << 20
	canary := canaryAt(t, n) // this process's canary, at the address the child's pool will have
	for i := range canary {
		canary[i] = cmaCanary
	}
	poolAddr := addrOf(canary)
	for _, c := range []struct {
		desc   string
		target func(t *testing.T) int
	}{
		{"a third process", func(t *testing.T) int {
			third := startCMAChild(t, "canary", fmt.Sprint(poolAddr), fmt.Sprint(n))
			return third.Cmd.Process.Pid
		}},
		{"this process", func(*testing.T) int { return os.Getpid() }},
	} {
		t.Run(c.desc, func(t *testing.T) {
			target := c.target(t)
			child := startCMAChild(t, "pool", fmt.Sprint(n), "11", fmt.Sprint(poolAddr-n))
			require.Equal(t, poolAddr, child.pool, "the child's pool lies where the canary is")
			b, rb, dst := cmaReader(t, n, Config{})
			t.Cleanup(func() { require.NoError(t, b.Close(true)) })
			forged := forgePID(t, b.WorkerAddress(), child.Addr, target)
			id, err := getFrom(t, b, rb, forged, child.key, child.pool, dst)
			require.NoError(t, err)
			cs := awaitCMAFinal(t, rb, id)
			require.False(t, holds(dst, cmaCanary), "the other process's memory landed in the pool")
			require.NoError(t, cs[len(cs)-1].Err)
			want := make([]byte, n)
			fill(want, 11)
			require.Equal(t, want, dst, "the real peer's pool, through UCX")
			require.Zero(t, b.CMAStats().Gets, "no process_vm_readv read")
		})
	}
}

// A read through the route must lie inside the registration the peer proved its key covers:
// one of the peer's own memory outside it (a secret next to the pool), or straddling its end,
// is refused before anything is read; one inside is read by process_vm_readv.
func TestCMA_ReadOutsideTheRegistrationIsRefused(t *testing.T) {
	const n = 1 << 20
	child := startCMAChild(t, "pool", fmt.Sprint(n), "12", "0")
	b, rb, dst := cmaReader(t, n, Config{})
	t.Cleanup(func() { require.NoError(t, b.Close(true)) })
	peer := transport.Peer(child.Addr)
	for _, c := range []struct {
		desc    string
		addr    uint64
		len     int
		refused bool
	}{
		{"inside", child.pool + 4096, n - 4096, false},
		{"the secret before the pool", child.secret, 4096, true},
		{"straddling the pool's start", child.pool - 64, 128, true},
		{"straddling the pool's end", child.pool + n - 4096, 8192, true},
		{"past the pool's end", child.pool + n, 4096, true},
	} {
		t.Run(c.desc, func(t *testing.T) {
			clear(dst)
			id, err := getFrom(t, b, rb, peer, child.key, c.addr, dst[:c.len])
			if c.refused {
				require.ErrorIs(t, err, transport.ErrBadRegion)
				require.ErrorIs(t, err, transport.ErrProtocol, "the peer's input broke the protocol: the engine counts it")
				var re *cmaRangeError
				require.ErrorAs(t, err, &re)
				require.False(t, holds(dst, cmaSecret), "the peer's secret landed in the pool")
				return
			}
			require.NoError(t, err)
			cs := awaitCMAFinal(t, rb, id)
			require.NoError(t, cs[len(cs)-1].Err)
			want := make([]byte, n)
			fill(want, 12)
			require.Equal(t, want[4096:], dst[:c.len])
		})
	}
	require.Equal(t, uint64(1), b.CMAStats().Gets, "only the read inside went by process_vm_readv")
}

// A vector get (PostGetVector) keeps the rule per range: one forged range among many inside
// the registration (the secret before the pool, or one straddling an end) refuses the whole
// get before any of it is read; the same vector without it reads every piece.
func TestCMA_VectorReadOutsideTheRegistrationIsRefused(t *testing.T) {
	const n, piece = 1 << 20, 1 << 10
	child := startCMAChild(t, "pool", fmt.Sprint(n), "12", "0")
	b, rb, dst := cmaReader(t, n, Config{})
	t.Cleanup(func() { require.NoError(t, b.Close(true)) })
	peer := transport.Peer(child.Addr)
	require.True(t, b.vectorGets(peer, child.key), "the child proves its pool")
	inside := func() []vectorget.Range { // every other KiB of the pool's second half
		var src []vectorget.Range
		for off := n / 2; off < n; off += 2 * piece {
			src = append(src, vectorget.Range{Addr: child.pool + uint64(off), Len: piece})
		}
		return src
	}
	for _, c := range []struct {
		desc   string
		forged *vectorget.Range
	}{
		{"inside", nil},
		{"the secret before the pool", &vectorget.Range{Addr: child.secret, Len: piece}},
		{"straddling the pool's start", &vectorget.Range{Addr: child.pool - 64, Len: piece}},
		{"straddling the pool's end", &vectorget.Range{Addr: child.pool + n - piece/2, Len: piece}},
	} {
		t.Run(c.desc, func(t *testing.T) {
			clear(dst)
			src := inside()
			if c.forged != nil {
				src[len(src)/2] = *c.forged
			}
			local := make([][]byte, len(src))
			for i := range src {
				local[i] = dst[i*piece : (i+1)*piece : (i+1)*piece]
			}
			id, err := post(t, rb, func(d func(transport.Completion)) (transport.OpID, error) {
				return b.postGetVector(peer, transport.Tag{Request: 7, Seq: 2}, child.key, src, local, d)
			})
			if c.forged != nil {
				require.ErrorIs(t, err, transport.ErrProtocol, "the peer's input broke the protocol: the engine counts it")
				var re *cmaRangeError
				require.ErrorAs(t, err, &re)
				require.Equal(t, make([]byte, n), dst, "nothing read, the secret least of all")
				return
			}
			require.NoError(t, err)
			cs := awaitCMAFinal(t, rb, id)
			require.NoError(t, cs[len(cs)-1].Err)
			want := make([]byte, n)
			fill(want, 12)
			for i, r := range src {
				off := int(r.Addr - child.pool)
				require.Equal(t, want[off:off+piece], dst[i*piece:(i+1)*piece], "piece %d", i)
			}
		})
	}
	require.Equal(t, uint64(1), b.CMAStats().Gets, "only the vector inside went by process_vm_readv")
}

// The route's liveness checks follow the process that proved itself, not a pid number: its
// pidfd names the peer's process, and once that process is gone every later check fails
// whatever process takes its pid; a peer gone before it proved anything, whose address now
// names another live process (as a reused pid would), is never read.
func TestCMA_PidReuseCannotRedirectReads(t *testing.T) {
	const n = 1 << 20
	t.Run("the pidfd follows the proven process", func(t *testing.T) {
		child := startCMAChild(t, "pool", fmt.Sprint(n), "13", "0")
		b, rb, dst := cmaReader(t, n, Config{})
		t.Cleanup(func() { require.NoError(t, b.Close(true)) })
		id, err := getFrom(t, b, rb, transport.Peer(child.Addr), child.key, child.pool, dst)
		require.NoError(t, err)
		cs := awaitCMAFinal(t, rb, id)
		require.NoError(t, cs[len(cs)-1].Err)
		require.Equal(t, uint64(1), b.CMAStats().Gets)
		fd := routePidfd(t, b)
		require.Equal(t, child.Cmd.Process.Pid, pidfdPID(t, fd), "the pidfd names the child")
		child.Signal(t, syscall.SIGKILL)
		require.Eventually(t, func() bool { return pidfdPID(t, fd) == -1 }, 20*time.Second, time.Millisecond,
			"the pidfd says the process is gone, whatever takes its pid")
	})
	t.Run("a dead peer's pid names another process", func(t *testing.T) {
		canary := canaryAt(t, n)
		child := startCMAChild(t, "pool", fmt.Sprint(n), "14", fmt.Sprint(addrOf(canary)-n))
		third := startCMAChild(t, "canary", fmt.Sprint(child.pool), fmt.Sprint(n))
		b, rb, dst := cmaReader(t, n, Config{})
		reused := forgePID(t, b.WorkerAddress(), child.Addr, third.Cmd.Process.Pid)
		require.NoError(t, b.PrepareKeys(reused, child.key), "endpoint and key made while the peer lived")
		child.Signal(t, syscall.SIGKILL)
		require.Eventually(t, func() bool { return unix.Kill(child.Cmd.Process.Pid, 0) == unix.ESRCH }, 20*time.Second, time.Millisecond,
			"the peer is dead and reaped")
		id, err := getFrom(t, b, rb, reused, child.key, child.pool, dst)
		require.NoError(t, b.Close(true)) // a UCX get to a dead peer ends when its endpoint does
		if err == nil {
			cs := awaitCMAFinal(t, rb, id)
			require.Error(t, cs[len(cs)-1].Err, "the peer is dead")
		}
		require.False(t, holds(dst, cmaCanary), "the other process's memory landed in the pool")
		require.Zero(t, b.CMAStats().Gets)
	})
}

// routePidfd is the pidfd of the one process_vm_readv route b holds.
func routePidfd(t *testing.T, b *ucxTransport) int {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for kid, k := range b.rma.keys {
		if kid.lane == 0 && k.cma.use {
			return k.cma.pidfd
		}
	}
	require.FailNow(t, "no process_vm_readv route")
	return -1
}

// pidfdPID is the pid a pidfd names, as the kernel says (-1 once the process is gone).
func pidfdPID(t *testing.T, fd int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Pid:"); ok {
			pid, err := strconv.Atoi(strings.TrimSpace(v))
			require.NoError(t, err)
			return pid
		}
	}
	require.FailNow(t, "no Pid in the pidfd's fdinfo", "%s", b)
	return 0
}

// A read the peer's memory blocks (a userfaultfd nobody serves: the kernel lets no signal stop
// that system call) ends its get within Config.CMAReadTimeout, failed with its memory unknown
// (the engine poisons the destination, L9); Close returns within its bound though the call
// still runs, and the thread comes back once the peer exits.
func TestL11_CMABlockedReadEndsWithinItsBound(t *testing.T) {
	const n = 1 << 20
	child := startCMAChild(t, "uffd", fmt.Sprint(n), "15")
	b, rb, dst := cmaReader(t, n, Config{CMAReadTimeout: 300 * time.Millisecond})
	id, err := getFrom(t, b, rb, transport.Peer(child.Addr), child.key, child.pool+n, dst)
	require.NoError(t, err)
	cs := awaitCMAFinal(t, rb, id)
	final := cs[len(cs)-1]
	require.Equal(t, transport.MemoryUnknown, final.Memory, "%v", final.Err)
	require.ErrorIs(t, final.Err, transport.ErrQuiescenceUnknown)
	require.Equal(t, uint64(1), b.CMAStats().Blocked)
	closed := make(chan error, 1)
	go func() { closed <- b.Close(true) }()
	select {
	case err := <-closed:
		t.Logf("Close: %v", err) // the destination's region is still held: Close says so
	case <-time.After(30 * time.Second):
		require.FailNow(t, "Close waits for a blocked read")
	}
	child.Signal(t, syscall.SIGKILL)
	require.Eventually(t, func() bool { return b.cma.stuck.Load() == 0 }, 20*time.Second, time.Millisecond,
		"the blocked call returns once the peer is gone")
}

// A proof's answer is data: the reader trusts it only when every part holds, and tells which
// did not. Each case answers over a real unix connection from this process, with the pid and
// pidfd taken as each kernel path takes them.
func TestCMA_ProofRefusesLies(t *testing.T) {
	var nonce, other [cmaNonceBytes]byte
	nonce[0], other[0] = 1, 2
	peerAddr := []byte("the peer's worker address")
	good := []cmaRange{{0x10000, 4096}, {0x40000, 1 << 20}}
	many := make([]cmaRange, cmaProofRanges+1)
	for i := range many {
		many[i] = cmaRange{uint64(i+1) << 20, 4096}
	}
	answer := appendAnswer(nil, nonce, peerAddr, good)
	self := os.Getpid()
	cases := []struct {
		desc      string
		answer    []byte
		claimed   int
		allowSelf bool
		hangUp    bool   // the answering side closes at once instead of waiting for the ack
		want      string // in the error; "" for a proof
	}{
		{"the peer's answer", answer, self, true, false, ""},
		{"another nonce", appendAnswer(nil, other, peerAddr, good), self, true, false, "another nonce"},
		{"another worker's address", appendAnswer(nil, nonce, []byte("another worker"), good), self, true, false, "another worker"},
		{"a pid the address does not claim", answer, self + 1, true, false, "names"},
		{"this very process", answer, self, false, false, "this very process"},
		{"a range that wraps around", appendAnswer(nil, nonce, peerAddr, []cmaRange{{^uint64(0) - 10, 100}}), self, true, false, "range"},
		{"an empty range", appendAnswer(nil, nonce, peerAddr, []cmaRange{{0x1000, 0}}), self, true, false, "range"},
		{"no range", appendAnswer(nil, nonce, peerAddr, nil), self, true, false, "0 ranges"},
		{"more ranges than the bound", appendAnswer(nil, nonce, peerAddr, many), self, true, false, "ranges"},
		{"an address longer than the bound", appendAnswer(nil, nonce, make([]byte, cmaMaxAddressBytes+1), good), self, true, false, "worker address"},
		{"not an answer", bytes.Repeat([]byte{'x'}, 64), self, true, false, "not an answer"},
		{"cut short", answer[:len(answer)-3], self, true, true, "reading the answer"},
		{"gone before the ack", answer, self, true, true, "hung up"},
	}
	for _, exact := range []bool{true, false} {
		for _, c := range cases {
			t.Run(fmt.Sprintf("%s/exact pidfd %v", c.desc, exact), func(t *testing.T) {
				ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: fmt.Sprintf("@kvxfer-cma-test-%d-%x", self, time.Now().UnixNano()), Net: "unix"})
				require.NoError(t, err)
				defer ln.Close()
				answered := make(chan struct{})
				go func() {
					defer close(answered)
					conn, err := net.Dial("unix", ln.Addr().String())
					if err != nil {
						return
					}
					defer conn.Close()
					_, _ = conn.Write(c.answer)
					if !c.hangUp {
						_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
						_, _ = conn.Read(make([]byte, 1))
					}
				}()
				conn, err := ln.AcceptUnix()
				require.NoError(t, err)
				if c.hangUp {
					<-answered
				}
				tr := &ucxTransport{}
				tr.cma.allowSelf = c.allowSelf
				tr.cma.alive = func(pidfd int) error { return unix.PidfdSendSignal(pidfd, 0, nil, 0) }
				tr.cma.peerPidfd = func(conn *net.UnixConn) (int, int, error) { return peerPidfdOf(conn, exact) }
				proof, err := tr.checkAnswer(conn, time.Now().Add(10*time.Second), nonce, peerAddr, c.claimed)
				_ = conn.Close()
				<-answered
				if c.want != "" {
					require.ErrorContains(t, err, c.want)
					return
				}
				require.NoError(t, err)
				defer unix.Close(proof.pidfd)
				require.Equal(t, self, proof.pid)
				require.Equal(t, self, pidfdPID(t, proof.pidfd), "the pidfd names the connecting process")
				require.Equal(t, good, proof.ranges)
			})
		}
	}
}

// A challenge is data too: the answering side connects only to a socket named as this package
// names its own, and reads every length before it uses it.
func TestCMA_ChallengeIsChecked(t *testing.T) {
	var nonce [cmaNonceBytes]byte
	nonce[3] = 9
	sock := cmaSocketPrefix + strings.Repeat("ab", cmaNonceBytes)
	good := cmaChallenge(nonce, sock, []byte("key"))
	withName := func(name string) []byte { return cmaChallenge(nonce, name, []byte("key")) }
	for _, c := range []struct {
		desc string
		msg  []byte
		want string
	}{
		{"a challenge", good, ""},
		{"another magic", append([]byte("KVXCMAQ2"), good[8:]...), "not a challenge"},
		{"too short", good[:20], "not a challenge"},
		{"a socket not of this package", withName("/run/some-daemon.sock" + strings.Repeat("x", cmaSocketNameLen-21)), "bad socket name"},
		{"a socket name not in hex", withName(cmaSocketPrefix + strings.Repeat("zz", cmaNonceBytes)), "bad socket name"},
		{"a socket name of another length", withName(sock + "00"), "socket name length"},
		{"no key", cmaChallenge(nonce, sock, nil), "key length"},
		{"a key longer than the message", good[:len(good)-1], "key length"},
		{"bytes after the key", append(bytes.Clone(good), 0), "key length"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			gotNonce, gotSock, key, err := parseChallenge(c.msg)
			if c.want != "" {
				require.ErrorContains(t, err, c.want)
				return
			}
			require.NoError(t, err)
			require.Equal(t, nonce, gotNonce)
			require.Equal(t, sock, gotSock)
			require.Equal(t, []byte("key"), key)
		})
	}
}
