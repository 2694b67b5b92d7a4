// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

// The proof a peer gives before this transport reads its memory with process_vm_readv
// (docs/security.md, "Same-host reads (process_vm_readv)").
//
// Everything in a peer's worker address (its pid, its host's system id, its pid namespace) is
// the peer's word, and a word can name any process. So the pid is taken from the kernel: this
// transport (the reader) listens on a fresh abstract unix socket and sends the peer, over the
// control wire (which reaches the peer's real worker), a challenge: a random 16-byte nonce,
// the socket's name and the remote key it wants to read through. The peer's transport
// connects to the socket and writes back the nonce, its own worker address and the ranges it
// registered under that key (native.Memory regions whose packed key it is). The reader takes
// the pid from the connection (SO_PEERPIDFD: a pidfd of the very process that connected,
// Linux 6.5; before that SO_PEERCRED's pid opened with pidfd_open while the connection is
// still open) and trusts it only when the nonce matches, the address is the peer's, the pid
// is the one the address claims and not this process's own. Only the process that received
// the nonce through the peer's worker can write it, and the kernel, not the peer, says which
// process wrote it. The ranges bound every later read (cmaCovers).

import (
	"bytes"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// The proof's bounds: how long the reader waits for the peer's answer, how many wrong
// connections it reads before it gives up (anyone on the host may connect to an abstract
// socket), how many ranges one answer may name, and how many answers a transport writes at
// once (each a goroutine, bounded by cmaProofTimeout too).
const (
	cmaProofTimeout  = 2 * time.Second
	cmaProofAccepts  = 4
	cmaProofRanges   = 64
	cmaProofAnswers  = 4
	cmaNonceBytes    = 16
	cmaSocketPrefix  = "kvxfer-cma-"
	cmaSocketNameLen = len(cmaSocketPrefix) + 2*cmaNonceBytes
	// cmaMaxAddressBytes bounds the worker address an answer carries: it is the peer's
	// address, which fits a control message.
	cmaMaxAddressBytes = 1 << 12
)

// The magic words of the challenge (a control message) and of the answer (on the socket).
// The challenge's first two bytes differ from the engine's wire magic, so an engine that
// predates the proof drops it as malformed; its peer then reads through UCX.
var (
	cmaChallengeMagic = [8]byte{'K', 'V', 'X', 'C', 'M', 'A', 'Q', '1'}
	cmaAnswerMagic    = [8]byte{'K', 'V', 'X', 'C', 'M', 'A', 'R', '1'}
)

// cmaRange is a registration a peer proved it holds: reads through its key lie inside one.
type cmaRange struct{ addr, len uint64 }

// cmaProof is what a peer proved: its process (pidfd names that very process) and the ranges
// its key covers.
type cmaProof struct {
	pid    int
	pidfd  int
	ranges []cmaRange
}

// errCMAUnproven: a peer did not prove which process it is (no answer in time, a wrong
// nonce, another worker's address, another pid than its address names, this very process),
// so its memory is not read with process_vm_readv; its gets go through UCX.
var errCMAUnproven = errors.New("kvxfer: the peer did not prove its process")

// proveCMA asks peer (whose worker address claims pid claimed) to prove it is that process and
// which ranges key covers; see the top of this file. It never reads the peer's memory.
func (t *ucxTransport) proveCMA(peer transport.Peer, key []byte, claimed int) (cmaProof, error) {
	peerAddr, err := hex.DecodeString(string(peer))
	if err != nil {
		return cmaProof{}, fmt.Errorf("%w: %w", errCMAUnproven, err)
	}
	var nonce, name [cmaNonceBytes]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return cmaProof{}, fmt.Errorf("%w: nonce: %w", errCMAUnproven, err)
	}
	if _, err := rand.Read(name[:]); err != nil {
		return cmaProof{}, fmt.Errorf("%w: socket name: %w", errCMAUnproven, err)
	}
	sock := cmaSocketPrefix + hex.EncodeToString(name[:])
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + sock, Net: "unix"})
	if err != nil {
		return cmaProof{}, fmt.Errorf("%w: listen: %w", errCMAUnproven, err)
	}
	defer ln.Close()
	deadline := time.Now().Add(cmaProofTimeout)
	if err := ln.SetDeadline(deadline); err != nil {
		return cmaProof{}, fmt.Errorf("%w: %w", errCMAUnproven, err)
	}
	if err := t.SendControl(peer, cmaChallenge(nonce, sock, key)); err != nil {
		return cmaProof{}, fmt.Errorf("%w: sending the challenge: %w", errCMAUnproven, err)
	}
	var errs []error
	for range cmaProofAccepts {
		conn, err := ln.AcceptUnix()
		if err != nil {
			errs = append(errs, fmt.Errorf("no answer within %v: %w", cmaProofTimeout, err))
			break
		}
		proof, err := t.checkAnswer(conn, deadline, nonce, peerAddr, claimed)
		_ = conn.Close()
		if err == nil {
			return proof, nil
		}
		errs = append(errs, err)
	}
	return cmaProof{}, fmt.Errorf("%w: %s: %w", errCMAUnproven, peer.Short(), errors.Join(errs...))
}

// checkAnswer reads one answer on conn and returns the proof it gives, with a pidfd of the
// process that connected, or why it gives none.
func (t *ucxTransport) checkAnswer(conn *net.UnixConn, deadline time.Time, nonce [cmaNonceBytes]byte, peerAddr []byte, claimed int) (cmaProof, error) {
	if err := conn.SetDeadline(deadline); err != nil {
		return cmaProof{}, err
	}
	got, ranges, err := readAnswer(conn)
	if err != nil {
		return cmaProof{}, err
	}
	if subtle.ConstantTimeCompare(got.nonce[:], nonce[:]) != 1 {
		return cmaProof{}, errors.New("the answer carries another nonce")
	}
	if !bytes.Equal(got.addr, peerAddr) {
		return cmaProof{}, errors.New("the answer comes from another worker than the peer's")
	}
	pid, pidfd, err := t.cma.peerPidfd(conn)
	if err != nil {
		return cmaProof{}, err
	}
	proof := cmaProof{pid: pid, pidfd: pidfd, ranges: ranges}
	refuse := func(err error) (cmaProof, error) {
		_ = unix.Close(pidfd)
		return cmaProof{}, err
	}
	switch {
	case pid == os.Getpid() && !t.cma.allowSelf:
		return refuse(errors.New("the answer comes from this very process"))
	case pid != claimed:
		return refuse(fmt.Errorf("the answer comes from process %d, the peer's address names %d", pid, claimed))
	}
	if err := t.cma.alive(pidfd); err != nil {
		return refuse(fmt.Errorf("the answering process is gone: %w", err))
	}
	// The ack lets the peer close; until then it kept the connection, so a pidfd_open of
	// SO_PEERCRED's pid (kernels before SO_PEERPIDFD) named a process that was still there.
	if _, err := conn.Write([]byte{1}); err != nil {
		return refuse(fmt.Errorf("the answering process hung up: %w", err))
	}
	return proof, nil
}

// peerPidfdOf is how a proof learns which process is on the other end of conn: a pidfd of it
// and its pid in this pid namespace. exact asks for SO_PEERPIDFD first (Linux 6.5); without
// it, or where the kernel lacks it, SO_PEERCRED's pid is opened with pidfd_open, and the
// connection must still be open after that (the peer holds it until the reader's ack).
func peerPidfdOf(conn *net.UnixConn, exact bool) (pid, pidfd int, err error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, -1, err
	}
	var cred *unix.Ucred
	pidfd = -1
	cerr := raw.Control(func(fd uintptr) {
		if cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err != nil {
			return
		}
		if !exact {
			return
		}
		if pidfd, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD); err != nil {
			pidfd = -1
			err = nil // before Linux 6.5: pidfd_open below, while the peer holds the connection
		}
	})
	if cerr != nil {
		return 0, -1, cerr
	}
	if err != nil {
		return 0, -1, fmt.Errorf("SO_PEERCRED: %w", err)
	}
	if cred.Pid <= 0 {
		return 0, -1, errors.New("the connecting process is outside this pid namespace")
	}
	if pidfd < 0 {
		if pidfd, err = unix.PidfdOpen(int(cred.Pid), 0); err != nil {
			return 0, -1, fmt.Errorf("pidfd_open: %w", err)
		}
		if alive, err := connOpen(raw); err != nil || !alive {
			_ = unix.Close(pidfd)
			return 0, -1, errors.New("the connecting process hung up before its pidfd was opened")
		}
	}
	return int(cred.Pid), pidfd, nil
}

// connOpen reports whether the other end of a connection still holds it.
func connOpen(raw interface {
	Control(func(uintptr)) error
}) (bool, error) {
	open := false
	err := raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		n, err := unix.Poll(fds, 0)
		open = err == nil && (n == 0 || fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) == 0)
	})
	return open, err
}

// cmaChallenge encodes a challenge:
//
//	magic [8] | nonce [16] | socket name length u8 | socket name | key length u16 | key
func cmaChallenge(nonce [cmaNonceBytes]byte, sock string, key []byte) []byte {
	b := append([]byte(nil), cmaChallengeMagic[:]...)
	b = append(b, nonce[:]...)
	b = append(b, byte(len(sock)))
	b = append(b, sock...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(key)))
	return append(b, key...)
}

// parseChallenge decodes a challenge, checking every length and the socket name's form (the
// answer goes only to a socket named as a reader of this package names its own).
func parseChallenge(b []byte) (nonce [cmaNonceBytes]byte, sock string, key []byte, err error) {
	const fixed = len(cmaChallengeMagic) + cmaNonceBytes + 1
	if len(b) < fixed || !bytes.Equal(b[:8], cmaChallengeMagic[:]) {
		return nonce, "", nil, errors.New("not a challenge")
	}
	copy(nonce[:], b[8:])
	n := int(b[fixed-1])
	rest := b[fixed:]
	if n != cmaSocketNameLen || len(rest) < n+2 {
		return nonce, "", nil, errors.New("challenge: bad socket name length")
	}
	sock = string(rest[:n])
	if _, err := hex.DecodeString(sock[len(cmaSocketPrefix):]); err != nil || sock[:len(cmaSocketPrefix)] != cmaSocketPrefix {
		return nonce, "", nil, errors.New("challenge: bad socket name")
	}
	rest = rest[n:]
	k := int(binary.LittleEndian.Uint16(rest))
	if k == 0 || len(rest) != 2+k {
		return nonce, "", nil, errors.New("challenge: bad key length")
	}
	return nonce, sock, rest[2:], nil
}

// cmaAnswerHead is an answer's fixed part.
type cmaAnswerHead struct {
	nonce [cmaNonceBytes]byte
	addr  []byte
}

// appendAnswer encodes an answer:
//
//	magic [8] | nonce [16] | address length u16 | worker address | range count u16 |
//	range count x (address u64 | length u64)
func appendAnswer(b []byte, nonce [cmaNonceBytes]byte, addr []byte, ranges []cmaRange) []byte {
	b = append(b, cmaAnswerMagic[:]...)
	b = append(b, nonce[:]...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(addr)))
	b = append(b, addr...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(ranges)))
	for _, r := range ranges {
		b = binary.LittleEndian.AppendUint64(b, r.addr)
		b = binary.LittleEndian.AppendUint64(b, r.len)
	}
	return b
}

// readAnswer reads one answer from r, every length bounded, every range checked for being
// non-empty and not wrapping around.
func readAnswer(r io.Reader) (cmaAnswerHead, []cmaRange, error) {
	var h cmaAnswerHead
	head := make([]byte, 8+cmaNonceBytes+2)
	if _, err := io.ReadFull(r, head); err != nil {
		return h, nil, fmt.Errorf("reading the answer: %w", err)
	}
	if !bytes.Equal(head[:8], cmaAnswerMagic[:]) {
		return h, nil, errors.New("not an answer")
	}
	copy(h.nonce[:], head[8:])
	n := int(binary.LittleEndian.Uint16(head[8+cmaNonceBytes:]))
	if n == 0 || n > cmaMaxAddressBytes {
		return h, nil, fmt.Errorf("answer: worker address of %d bytes", n)
	}
	body := make([]byte, n+2)
	if _, err := io.ReadFull(r, body); err != nil {
		return h, nil, fmt.Errorf("reading the answer: %w", err)
	}
	h.addr = body[:n]
	count := int(binary.LittleEndian.Uint16(body[n:]))
	if count == 0 || count > cmaProofRanges {
		return h, nil, fmt.Errorf("answer: %d ranges", count)
	}
	rb := make([]byte, 16*count)
	if _, err := io.ReadFull(r, rb); err != nil {
		return h, nil, fmt.Errorf("reading the answer: %w", err)
	}
	ranges := make([]cmaRange, count)
	for i := range ranges {
		ranges[i] = cmaRange{binary.LittleEndian.Uint64(rb[16*i:]), binary.LittleEndian.Uint64(rb[16*i+8:])}
		if r := ranges[i]; r.len == 0 || r.addr+r.len < r.addr {
			return h, nil, fmt.Errorf("answer: range [%#x, +%d)", r.addr, r.len)
		}
	}
	return h, ranges, nil
}

// answerChallenge answers a challenge that arrived on the control wire, if b is one: it
// connects to the reader's socket and writes the ranges this transport registered under the
// key (host memory only), on a goroutine bounded by cmaProofTimeout, at most cmaProofAnswers
// at once (more are dropped: the reader reads through UCX then). A key this transport did not
// pack is not answered. It reports whether b was a challenge.
func (t *ucxTransport) answerChallenge(b []byte) bool {
	if len(b) < len(cmaChallengeMagic) || !bytes.Equal(b[:len(cmaChallengeMagic)], cmaChallengeMagic[:]) {
		return false
	}
	nonce, sock, key, err := parseChallenge(b)
	if err != nil {
		t.log.Debug("ucx: malformed process_vm_readv challenge dropped", zap.Error(err))
		return true
	}
	t.mu.Lock()
	var ranges []cmaRange
	for mem, packed := range t.rma.packed {
		if mem.Kind() == native.MemoryHost && bytes.Equal(packed, key) && len(ranges) < cmaProofRanges {
			ranges = append(ranges, cmaRange{mem.Addr(), uint64(mem.Len())})
		}
	}
	addr, closed := append([]byte(nil), t.addr...), t.closed
	if len(ranges) == 0 || closed {
		t.mu.Unlock()
		return true
	}
	select {
	case t.cma.answers <- struct{}{}:
	default:
		t.mu.Unlock()
		return true
	}
	t.cma.answering.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.cma.answering.Done()
		defer func() { <-t.cma.answers }()
		conn, err := net.DialTimeout("unix", "@"+sock, cmaProofTimeout)
		if err != nil {
			return
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(cmaProofTimeout))
		if _, err := conn.Write(appendAnswer(nil, nonce, addr, ranges)); err != nil {
			return
		}
		_, _ = conn.Read(make([]byte, 1)) // the reader's ack: it holds our pidfd now
	}()
	return true
}
