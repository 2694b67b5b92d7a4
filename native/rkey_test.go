// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// rkeyChildEnv carries the peer's worker address (hex) a child test process connects to; the
// other variable the transports. The keys come on the child's standard input.
const rkeyChildEnv = "KVX_RKEY_CHILD"

// TestRemoteKeyChild is the child side of rkeyChild: it connects a fresh worker to the peer (a
// live worker in the parent, whose memory the keys name, or with no peer given one of its
// own), prints "CHILD: ready", then for each line "OP KEY" on its standard input (KEY in hex,
// OP "-", "pause" or parseRKeyOp's form) unpacks the key, views or gets the range when told (reading
// every byte of a view) and prints one line "CHILD: <outcome>". With "pause" it prints
// "CHILD: checked" once the key's segment was checked and waits for a line before UCX attaches
// it. A crash inside UCX or on a read kills only this process.
func TestRemoteKeyChild(t *testing.T) {
	h, ok := os.LookupEnv(rkeyChildEnv)
	if !ok {
		t.Skip("run by rkeyChild only")
	}
	peer, err := hex.DecodeString(h)
	require.NoError(t, err)
	tls := os.Getenv(rkeyChildEnv + "_TLS")
	cfg := ContextConfig{TLS: tls}
	if strings.Contains(tls, "tcp") {
		cfg.NetDevices = "lo"
	}
	c, err := NewContext(cfg)
	require.NoError(t, err)
	w, err := c.NewWorker(WorkerConfig{})
	require.NoError(t, err)
	if len(peer) == 0 { // no peer in the parent: a worker of this process's own
		pc, err := NewContext(cfg)
		require.NoError(t, err)
		pw, err := pc.NewWorker(WorkerConfig{})
		require.NoError(t, err)
		peer = pw.Address()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ep, err := w.Connect(ctx, peer)
	require.NoError(t, err)
	fmt.Println("CHILD: ready")
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<16), 1<<20)
	for in.Scan() {
		op, h, _ := strings.Cut(in.Text(), " ")
		key, err := hex.DecodeString(h)
		require.NoError(t, err)
		if op == "pause" {
			// Stop between the check of the key's segment and UCX's attach of it: say so, and
			// go on at the parent's next line (the parent meanwhile takes the segment away).
			op = "-"
			afterSegmentCheck = func() {
				fmt.Println("CHILD: checked")
				in.Scan()
			}
		}
		fmt.Println("CHILD:", unpackAndRead(t, c, ep, key, op))
		afterSegmentCheck = nil
	}
	os.Exit(0) // what mattered is that nothing faulted; the parent's worker outlives this one
}

// unpackAndRead is one key's turn in the child: the outcome of unpacking it and of op.
func unpackAndRead(t *testing.T, c *Context, ep *Endpoint, key []byte, op string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rk, err := ep.UnpackRemoteKey(ctx, key)
	switch {
	case errors.Is(err, ErrBadRemoteKey):
		return "refused: " + err.Error()
	case err != nil:
		return "failed: " + err.Error()
	}
	defer rk.Close()
	op, addr, n := parseRKeyOp(t, op)
	switch op {
	case "view":
		v, err := rk.View(addr, n)
		if err != nil {
			require.ErrorIs(t, err, ErrOutOfBounds)
			return "view refused: " + err.Error()
		}
		return fmt.Sprint("view read ", readAll(v))
	case "get":
		mem, err := c.Allocate(int64(n))
		require.NoError(t, err)
		defer func() { require.NoError(t, mem.Close()) }()
		if err := ep.Get(mem, 0, int64(n), addr, rk).Wait(ctx); err != nil {
			return "get failed: " + err.Error()
		}
		return fmt.Sprint("get read ", n)
	}
	// The whole memory the key was checked to name: every byte must be readable.
	read := 0
	if base, size, ok := rk.bounds(); ok {
		v, err := rk.View(base, int(size))
		require.NoError(t, err)
		read = readAll(v)
	}
	return fmt.Sprint("unpacked, mapped ", rk.Mapped(), " read ", read)
}

// readAll loads every byte of v (so a view past the peer's memory faults here) and returns
// how many it read.
func readAll(v []byte) int {
	var sum byte
	for _, b := range v {
		sum ^= b
	}
	_ = sum
	return len(v)
}

// parseRKeyOp reads "view:ADDR:N" or "get:ADDR:N" (ADDR in hex); "-" is no operation.
func parseRKeyOp(t testing.TB, s string) (op string, addr uint64, n int) {
	if s == "-" {
		return "", 0, 0
	}
	f := strings.Split(s, ":")
	require.Len(t, f, 3, "op %q", s)
	addr, err := strconv.ParseUint(f[1], 16, 64)
	require.NoError(t, err)
	n, err = strconv.Atoi(f[2])
	require.NoError(t, err)
	return f[0], addr, n
}

// rkeyChild is a child process that unpacks keys for the parent (TestRemoteKeyChild), one per
// line, connected to the worker at peer (nil: one in the child; over TCP it must be, since UCX
// 1.13 can abort a worker whose TCP peer exits in the middle of wireup, and the parent must
// survive the child). One child serves many keys: starting one costs far more than a key.
type rkeyChild struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // the child's "CHILD: " lines; closed when its output ends
	output *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startRKeyChild starts a child and waits (at most a minute: a loaded host starts processes
// slowly) until it is connected and ready. It lives until t ends.
func startRKeyChild(t testing.TB, tls string, peer []byte) *rkeyChild {
	t.Helper()
	return startRKeyChildFor(t, t, tls, peer)
}

// startRKeyChildFor is startRKeyChild for a child that outlives t, the test that waits for it
// to start: it lives until owner (t or one of t's parents) ends.
func startRKeyChildFor(t, owner testing.TB, tls string, peer []byte) *rkeyChild {
	t.Helper()
	return startLineChild(t, owner, "TestRemoteKeyChild", rkeyChildEnv+"="+hex.EncodeToString(peer), rkeyChildEnv+"_TLS="+tls)
}

// startLineChild starts this test binary as a child running only test (a child side that takes
// one input per line and answers each with a "CHILD: " line) with env added, and waits for its
// "ready" line as startRKeyChild does.
func startLineChild(t, owner testing.TB, test string, env ...string) *rkeyChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	ch := &rkeyChild{cmd: cmd, lines: make(chan string, 1), output: &lockedBuffer{}}
	var err error
	ch.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = ch.output
	require.NoError(t, cmd.Start())
	go func() {
		defer close(ch.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			_, _ = ch.output.Write(append(sc.Bytes(), '\n'))
			if line, ok := strings.CutPrefix(sc.Text(), "CHILD: "); ok {
				ch.lines <- line
			}
		}
	}()
	owner.Cleanup(ch.stop)
	require.Equal(t, "ready", ch.next(t, time.Minute), "the child did not start")
	return ch
}

// tableChild serves the cases of one table from one child, started (by start) at the first
// case and again after any case that failed (its child may have died on the input, or be stuck
// in UCX), so a crash of one case still never hides the next, and the cases that pass share a
// start. Starting a child (a -race test binary and a UCX context) costs about a second on the
// 2-core CI host; a case, milliseconds.
type tableChild struct {
	start func(t testing.TB) *rkeyChild // a child that lives until the table ends
	ch    *rkeyChild
}

// rkeyTable is a tableChild of TestRemoteKeyChild's, connected to peer; owner is the table.
func rkeyTable(owner testing.TB, tls string, peer []byte) *tableChild {
	return &tableChild{start: func(t testing.TB) *rkeyChild { return startRKeyChildFor(t, owner, tls, peer) }}
}

// try is rkeyChild.try in the table's child; t is the case.
func (c *tableChild) try(t testing.TB, key []byte, op string) string {
	t.Helper()
	if op == "" {
		op = "-"
	}
	return c.ask(t, fmt.Sprintf("%s %s", op, hex.EncodeToString(key)), 8*time.Second)
}

// ask sends the table's child one line and returns its answer, waiting at most d.
func (c *tableChild) ask(t testing.TB, line string, d time.Duration) string {
	t.Helper()
	if c.ch == nil {
		c.ch = c.start(t)
	}
	passed := false
	defer func() {
		if !passed || t.Failed() {
			c.ch = nil // stopped when the table ends
		}
	}()
	got := c.ch.ask(t, line, d)
	passed = true
	return got
}

// next is the child's next line, or fails the test when it died or said nothing within d.
func (ch *rkeyChild) next(t testing.TB, d time.Duration) string {
	t.Helper()
	select {
	case line, ok := <-ch.lines:
		if !ok {
			err := ch.cmd.Wait()
			t.Fatalf("the child died (%v):\n%s", err, ch.output)
		}
		return line
	case <-time.After(d):
		t.Fatalf("the child said nothing for %v:\n%s", d, ch.output)
	}
	return ""
}

// try has the child unpack key and run op ("-" or parseRKeyOp's form), and returns what it
// said; a child that dies on it (a UCX assert, a fault reading the peer's memory) fails the
// test with its output.
func (ch *rkeyChild) try(t testing.TB, key []byte, op string) string {
	t.Helper()
	return ch.ask(t, fmt.Sprintf("%s %s", op, hex.EncodeToString(key)), 8*time.Second) // under the fuzzing worker's 10 s per input
}

// ask sends the child one line and returns its answer, waiting at most d; a child that is gone
// or dies on the line fails the test with its output.
func (ch *rkeyChild) ask(t testing.TB, line string, d time.Duration) string {
	t.Helper()
	_, err := fmt.Fprintf(ch.stdin, "%s\n", line)
	require.NoError(t, err, "the child is gone:\n%s", ch.output)
	return ch.next(t, d)
}

// stop ends the child: its standard input closes and it exits; killed if it does not.
func (ch *rkeyChild) stop() {
	_ = ch.stdin.Close()
	done := make(chan struct{})
	go func() {
		for range ch.lines {
		}
		_ = ch.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = ch.cmd.Process.Kill()
		<-done
	}
}

// rkeyPeer is the parent side: a live worker (the peer a child connects to over shared memory)
// and memory UCX allocated through its context, whose key the tests edit.
type rkeyPeer struct {
	tls  string
	addr []byte // what a child connects to: the worker's address, nil over TCP
	ctx  *Context
	w    *Worker
	mem  *Memory
	key  []byte
	kind string // the transport that maps mem into a peer: "posix", "sysv", or "" (none: tcp)
}

// The transports whose keys the tests feed in: shared memory through posix and through sysv
// (UCX's default allocates with sysv), and TCP, which maps nothing.
var rkeyTransports = []struct{ name, tls, kind string }{
	{"posix", "posix,cma,self", "posix"},
	{"sysv", "sysv,cma,self", "sysv"},
	{"tcp", "tcp,self", ""},
}

func newRKeyPeer(t testing.TB, tls, kind string, size int64) *rkeyPeer {
	t.Helper()
	cfg := ContextConfig{TLS: tls}
	if strings.Contains(tls, "tcp") {
		cfg.NetDevices = "lo"
	}
	c, err := NewContext(cfg)
	require.NoError(t, err)
	w, err := c.NewWorker(WorkerConfig{})
	require.NoError(t, err)
	m, err := c.Allocate(size)
	require.NoError(t, err)
	key, err := m.PackRemoteKey()
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, m.Close())
		require.NoError(t, w.Close())
		require.NoError(t, c.Close())
	})
	var addr []byte
	if !strings.Contains(tls, "tcp") {
		addr = w.Address()
	}
	return &rkeyPeer{tls: tls, addr: addr, ctx: c, w: w, mem: m, key: key, kind: kind}
}

// tlKey finds the transport key of kind ("posix", "sysv") in a packed key made by this UCX
// (md map | memory type | per md: length, bytes) and returns its offset and length.
func tlKey(t testing.TB, key []byte, mdIndex int) (at, n int) {
	t.Helper()
	mdMap := binary.LittleEndian.Uint64(key)
	at = 9
	for i := 0; i < 64; i++ {
		if mdMap&(1<<i) == 0 {
			continue
		}
		n = int(key[at])
		if i == mdIndex {
			return at + 1, n
		}
		at += 1 + n
	}
	t.Fatalf("md %d not in key %x", mdIndex, key)
	return 0, 0
}

// mappedMD is the md index of the transport key that maps the memory (the only one with a
// non-empty key over shared memory).
func mappedMD(t testing.TB, key []byte) int {
	t.Helper()
	mdMap := binary.LittleEndian.Uint64(key)
	at := 9
	for i := 0; i < 64; i++ {
		if mdMap&(1<<i) == 0 {
			continue
		}
		if key[at] != 0 {
			return i
		}
		at += 1 + int(key[at])
	}
	return -1
}

// mdKeysEnd is where the md keys of a packed key end: its end with UCX 1.13, the start of the
// system-device section with a later UCX.
func mdKeysEnd(key []byte) int {
	mdMap := binary.LittleEndian.Uint64(key)
	at := 9
	for i := 0; i < 64; i++ {
		if mdMap&(1<<i) != 0 {
			at += 1 + int(key[at])
		}
	}
	return at
}

func edited(key []byte, f func(b []byte) []byte) []byte { return f(append([]byte(nil), key...)) }

// mdOfTransport is the md index the worker address addr gives the transport named name, -1
// when the address has no such transport (or no address: nil).
func mdOfTransport(t testing.TB, addr []byte, name string) int {
	t.Helper()
	if addr == nil {
		return -1
	}
	withName, err := addressHasName(addr)
	require.NoError(t, err)
	md := -1
	require.NoError(t, walkAddressEntries(addr, withName, func(e addrEntry) error {
		if e.csum == crc16String(name) {
			md = int(e.md & addrMDIndexMask)
		}
		return nil
	}))
	return md
}

// withEmptyMDKey is key with an empty transport key for md added (key must not name md yet).
func withEmptyMDKey(t testing.TB, key []byte, md int) []byte {
	t.Helper()
	mdMap := binary.LittleEndian.Uint64(key)
	require.Zero(t, mdMap&(1<<md), "the key names md %d already", md)
	at := 9
	for i := 0; i < md; i++ {
		if mdMap&(1<<i) != 0 {
			at += 1 + int(key[at])
		}
	}
	b := append(append(append([]byte(nil), key[:at]...), 0), key[at:]...)
	binary.LittleEndian.PutUint64(b, mdMap|1<<md)
	return b
}

// TestRemoteKey_ViewStaysInsideThePeersSegment: a view through a mapped key is refused with
// ErrOutOfBounds unless it lies inside the segment the key names (its address and length, no
// larger than the segment really is): a 1 TiB view over a 1 MiB segment, one at an address of
// this process's own, one reaching past the segment's end, and ranges whose end wraps around.
func TestRemoteKey_ViewStaysInsideThePeersSegment(t *testing.T) {
	for _, tr := range rkeyTransports[:2] {
		t.Run(tr.name, func(t *testing.T) {
			p := newPair(t, tr.tls)
			m := alloc(t, p.ctxB, 1<<20)
			packed, err := m.PackRemoteKey()
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			rk, err := p.ab.UnpackRemoteKey(ctx, packed)
			cancel()
			require.NoError(t, err)
			defer rk.Close()
			require.True(t, rk.Mapped())
			own := make([]byte, 4096)
			base, size := m.Addr(), uint64(m.Len())
			for _, c := range []struct {
				desc string
				addr uint64
				n    int
				ok   bool
			}{
				{"the whole segment", base, int(size), true},
				{"its last byte", base + size - 1, 1, true},
				{"1 TiB from its start", base, 1 << 40, false},
				{"at an address of this process's own", uint64(uintptr(unsafe.Pointer(&own[0]))), len(own), false},
				{"one byte before it", base - 1, 2, false},
				{"from its last page to past its end", base + size - 4096, 8192, false},
				{"just past its end", base + size, 1, false},
				{"an end that wraps around", ^uint64(0) - 10, 100, false},
				{"a length that wraps the address around", base + 4096, int(^uint64(0) >> 1), false},
			} {
				v, err := rk.View(c.addr, c.n)
				if c.ok {
					require.NoError(t, err, c.desc)
					require.Len(t, v, c.n, c.desc)
					continue
				}
				require.ErrorIs(t, err, ErrOutOfBounds, c.desc)
				var be *BoundsError
				require.ErrorAs(t, err, &be, c.desc)
				require.Nil(t, v, c.desc)
			}
		})
	}
}

// TestRemoteKey_ReadPastTheSegmentIsRefusedNotAFault: in a child process (a fault would kill
// it and fail the test, where in the suite it would kill the suite), a view and a get that
// reach past the end of the peer's segment are refused, and within it they read every byte.
func TestRemoteKey_ReadPastTheSegmentIsRefusedNotAFault(t *testing.T) {
	for _, tr := range rkeyTransports[:2] {
		t.Run(tr.name, func(t *testing.T) {
			p := newRKeyPeer(t, tr.tls, tr.kind, 1<<20)
			end := p.mem.Addr() + uint64(p.mem.Len())
			child := rkeyTable(t, p.tls, p.addr)
			for _, c := range []struct {
				desc, op, want string
			}{
				{"a view of the last page", fmt.Sprintf("view:%x:%d", end-4096, 4096), "view read 4096"},
				{"a view from the last page to 1 MiB past the end", fmt.Sprintf("view:%x:%d", end-4096, 4096+1<<20), "view refused:"},
				{"a get of the last page", fmt.Sprintf("get:%x:%d", end-4096, 4096), "get read 4096"},
				{"a get from the last page to 1 MiB past the end", fmt.Sprintf("get:%x:%d", end-4096, 4096+1<<20), "get failed:"},
			} {
				t.Run(c.desc, func(t *testing.T) {
					got := child.try(t, p.key, c.op)
					require.True(t, strings.HasPrefix(got, c.want), "the child: %s", got)
					if c.want == "get failed:" {
						require.Contains(t, got, ErrOutOfBounds.Error())
					}
				})
			}
		})
	}
}

// TestRemoteKey_SegmentGoneBetweenCheckAndAttach: the peer's segment goes away (the peer
// released its memory, as a restarting or killed peer does) after UnpackRemoteKey checked it
// and before UCX attached it. UCX 1.13 then fails the attach inside ucp_ep_rkey_unpack and
// destroys the half-made key, which crashed the process (SIGSEGV at 0x38, seen in the peer
// soak). The segment checked must be the one UCX attaches: the key still unpacks, in a child
// process (a crash fails the test), and every byte it names reads.
func TestRemoteKey_SegmentGoneBetweenCheckAndAttach(t *testing.T) {
	for _, tr := range rkeyTransports[:2] {
		t.Run(tr.name, func(t *testing.T) {
			const size = 1 << 20
			p := newRKeyPeer(t, tr.tls, tr.kind, size)
			ch := startRKeyChild(t, p.tls, p.addr)
			_, err := fmt.Fprintf(ch.stdin, "pause %s\n", hex.EncodeToString(p.key))
			require.NoError(t, err)
			require.Equal(t, "checked", ch.next(t, 8*time.Second))
			require.NoError(t, p.mem.Close()) // the segment's last holder but the child's check
			_, err = fmt.Fprintln(ch.stdin, "go")
			require.NoError(t, err)
			require.Equal(t, fmt.Sprint("unpacked, mapped true read ", size), ch.next(t, 8*time.Second))
		})
	}
}

// TestRemoteKey_UnpackHoldsNothingOnceAttached: what UnpackRemoteKey holds of the peer's
// segment from its check to UCX's attach is let go once UCX attached it, whether the unpack
// succeeded or not: no descriptor of a posix segment stays open here, no attachment of a sysv
// segment is left but UCX's own mapping, which goes with the key.
func TestRemoteKey_UnpackHoldsNothingOnceAttached(t *testing.T) {
	for _, tr := range rkeyTransports[:2] {
		t.Run(tr.name, func(t *testing.T) {
			p := newPair(t, tr.tls)
			m := alloc(t, p.ctxB, 1<<20)
			packed, err := m.PackRemoteKey()
			require.NoError(t, err)
			seg, err := parseRemoteKey(packed, p.ab.peerAddr, p.a.address)
			require.NoError(t, err)
			require.NotNil(t, seg)
			held := func() int { // this process's descriptors of posix segments, or the sysv segment's attachments
				if seg.kind == rkeySysv {
					var ds unix.SysvShmDesc
					_, err := unix.SysvShmCtl(int(seg.shmid), unix.IPC_STAT, &ds)
					require.NoError(t, err)
					return int(ds.Nattch)
				}
				fds, err := os.ReadDir("/proc/self/fd")
				require.NoError(t, err)
				n := 0
				for _, fd := range fds {
					if target, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && strings.Contains(target, posixSegFileName) {
						n++
					}
				}
				return n
			}
			before := held()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			for range 3 {
				rk, err := p.ab.UnpackRemoteKey(ctx, packed)
				require.NoError(t, err)
				v, err := rk.View(m.Addr(), int(m.Len()))
				require.NoError(t, err)
				require.Len(t, v, int(m.Len()))
				want := before // UCX keeps no descriptor of a posix segment it mapped
				if seg.kind == rkeySysv {
					want++ // UCX's own attachment, for as long as the key
				}
				require.Equal(t, want, held())
				rk.Close()
				_, err = p.a.Info(ctx) // the loop ran the Close queued before it
				require.NoError(t, err)
				require.Equal(t, before, held())
			}
			// A key refused once its segment is held (posix: 1 TiB declared over the file; sysv:
			// an address whose end wraps) lets go of it too.
			_, err = p.ab.UnpackRemoteKey(ctx, edited(packed, func(b []byte) []byte {
				if seg.kind == rkeySysv {
					binary.LittleEndian.PutUint64(b[seg.at+4:], ^uint64(0)-10)
				} else {
					binary.LittleEndian.PutUint64(b[seg.at+16:], 1<<40)
				}
				return b
			}))
			require.ErrorIs(t, err, ErrBadRemoteKey)
			require.Equal(t, before, held())
		})
	}
}

// TestRemoteKey_RefusesABadKey: a key UCX would assert on, read past, or attach wrongly (a
// peer's garbage, a real key cut short, with bytes after it, or with a field changed) is
// refused with ErrBadRemoteKey before UCX sees it, in a child process so that a UCX abort
// fails the test; the real key still unpacks and every byte it names reads.
func TestRemoteKey_RefusesABadKey(t *testing.T) {
	for _, tr := range rkeyTransports {
		t.Run(tr.name, func(t *testing.T) {
			p := newRKeyPeer(t, tr.tls, tr.kind, 1<<20)
			good := p.key
			md := mappedMD(t, good)
			mapped := func(f func(b []byte, at int)) []byte {
				if md < 0 {
					return nil
				}
				return edited(good, func(b []byte) []byte { at, _ := tlKey(t, b, md); f(b, at); return b })
			}
			cases := []struct {
				desc string
				key  []byte
			}{
				{"one byte", []byte{7}},
				{"an md map and nothing else", good[:8]},
				{"cut short by one byte", good[:mdKeysEnd(good)-1]},
				// Refused by a UCX that packs nothing after the md keys (1.13) and by one that packs
				// a system-device section there (a cut distance record).
				{"bytes after the end", append(append([]byte(nil), good...), 0, 1)},
				{"a system-device section with a cut distance", append(append([]byte(nil), good...), 0, 1, 0x10)},
				{"an unknown memory type", edited(good, func(b []byte) []byte { b[8] = 0x7f; return b })},
				{"an md map naming every md", edited(good, func(b []byte) []byte { binary.LittleEndian.PutUint64(b, ^uint64(0)); return b })},
				{"a transport key length past the end", edited(good, func(b []byte) []byte { b[9] = 0xff; return b })},
				{"an empty transport key made longer", edited(good, func(b []byte) []byte { b[9]++; return append(b, 0) })},
			}
			if md >= 0 {
				cases = append(cases, []struct {
					desc string
					key  []byte
				}{
					{"the mapped transport's key cut short", edited(good, func(b []byte) []byte {
						at, n := tlKey(t, b, md)
						b[at-1] = byte(n - 4)
						return append(b[:at+n-4], b[at+n:]...)
					})},
				}...)
			}
			// A key naming the peer's cma md, whose key this UCX refuses to unpack (1.22: cma's
			// component fails every unpack, and with it the whole key).
			if cma := mdOfTransport(t, p.addr, "cma"); rkeyUnpackRefused["cma"] && cma >= 0 {
				cases = append(cases, struct {
					desc string
					key  []byte
				}{"an empty key for the cma md", withEmptyMDKey(t, good, cma)})
			}
			switch p.kind {
			case "posix":
				cases = append(cases, []struct {
					desc string
					key  []byte
				}{
					{"a zero length (UCX asserts)", mapped(func(b []byte, at int) { binary.LittleEndian.PutUint64(b[at+16:], 0) })},
					{"1 TiB over a 1 MiB segment", mapped(func(b []byte, at int) { binary.LittleEndian.PutUint64(b[at+16:], 1<<40) })},
					{"an address whose end wraps", mapped(func(b []byte, at int) { binary.LittleEndian.PutUint64(b[at+8:], ^uint64(0)-4096) })},
					{"a segment id without procfs or shm_open flags (a directory the key lacks)",
						mapped(func(b []byte, at int) { b[at+7] &^= 0xc0 })},
					{"a shm_open segment that does not exist", mapped(func(b []byte, at int) { b[at+7] &^= 0x80 })},
					{"another process's file descriptor", mapped(func(b []byte, at int) {
						id := binary.LittleEndian.Uint64(b[at:])
						binary.LittleEndian.PutUint64(b[at:], id&^(1<<30-1)|1) // pid 1
					})},
					{"a file descriptor the peer does not have", mapped(func(b []byte, at int) {
						id := binary.LittleEndian.Uint64(b[at:])
						binary.LittleEndian.PutUint64(b[at:], id&^((1<<30-1)<<30)|(1<<30-2)<<30)
					})},
					{"a file descriptor that is not shared memory (the peer's stdin)", mapped(func(b []byte, at int) {
						id := binary.LittleEndian.Uint64(b[at:])
						binary.LittleEndian.PutUint64(b[at:], id&^((1<<30-1)<<30))
					})},
					{"a shm_open segment that is a FIFO (opening it would block)", mapped(func(b []byte, at int) {
						mmid := uint64(0x7ead0000 + os.Getpid())
						path := fmt.Sprintf("/dev/shm/%s%x", posixSegFileName, mmid)
						require.NoError(t, unix.Mkfifo(path, 0o600))
						t.Cleanup(func() { _ = os.Remove(path) })
						binary.LittleEndian.PutUint64(b[at:], posixSegFlagShmOpen|mmid)
					})},
				}...)
			case "sysv":
				cases = append(cases, []struct {
					desc string
					key  []byte
				}{
					{"a shared memory id that does not exist", mapped(func(b []byte, at int) { binary.LittleEndian.PutUint32(b[at:], 0x7ffffff0) })},
					{"an owner address whose segment end wraps", mapped(func(b []byte, at int) { binary.LittleEndian.PutUint64(b[at+4:], ^uint64(0)-4096) })},
				}...)
			}
			child := rkeyTable(t, p.tls, p.addr)
			for _, c := range cases {
				t.Run(c.desc, func(t *testing.T) {
					got := child.try(t, c.key, "")
					t.Logf("the child: %s", got)
					require.True(t, strings.HasPrefix(got, "refused:"), "the child: %s", got)
				})
			}
			got := child.try(t, good, "")
			want := "unpacked, mapped false read 0"
			if p.kind != "" {
				want = fmt.Sprintf("unpacked, mapped true read %d", p.mem.Len())
			}
			require.Equal(t, want, got)
		})
	}
}

// FuzzRemoteKey: whatever bytes a peer sends as a remote key, CheckRemoteKey refuses them with
// a *RemoteKeyError or a child process unpacks them without dying, and reads every byte of the
// memory the key was checked to name. The child connects to a live worker here (over posix or
// sysv, as which picks), so that keys naming this process's segments pass the checks that tie
// a segment to its peer and reach UCX's attach; one child serves every input, and one that
// dies fails the input it was given. The seeds are both workers'
// real keys (fresh each run: they name this process's pid and descriptors) and those kept
// under testdata.
func FuzzRemoteKey(f *testing.F) {
	peers := []*rkeyPeer{
		newRKeyPeer(f, "posix,cma,self", "posix", 1<<20),
		newRKeyPeer(f, "sysv,cma,self", "sysv", 1<<20),
	}
	children := make([]*rkeyChild, len(peers)) // one child serves every key that reaches UCX
	for i, p := range peers {
		children[i] = startRKeyChild(f, p.tls, p.addr)
	}
	for i, p := range peers {
		f.Add(uint8(i), p.key)
		f.Add(uint8(i), p.key[:len(p.key)-1])
		f.Add(uint8(i), append(append([]byte(nil), p.key...), 0))
		// System-device sections as a UCX after 1.13 packs them (a device, distances to devices
		// below 64 in increasing order), and broken ones.
		for _, sec := range [][]byte{{3, 0, 0x40, 0x80, 5, 0x41, 0x81}, {0, 1, 2}, {0, 70, 1, 1}, {0, 5, 1, 1, 5, 1, 1}, {rkeySysDevUnknown}, {rkeySysDevUnknown, 1, 2, 3}} {
			f.Add(uint8(i), append(append([]byte(nil), p.key...), sec...))
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, key []byte) {
		p := peers[int(which)%len(peers)]
		if err := CheckRemoteKey(key, p.addr, p.addr); err != nil {
			var ke *RemoteKeyError
			require.ErrorAs(t, err, &ke)
			require.ErrorIs(t, err, ErrBadRemoteKey)
			return
		}
		got := children[int(which)%len(peers)].try(t, key, "-") // fails the input if the child died
		require.False(t, strings.HasPrefix(got, "failed:"), "UCX failed a key the checks accepted: %s", got)
	})
}
