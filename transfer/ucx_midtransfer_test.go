// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/peerproc"
)

// How many rows of a UCX test run at once (rowGroup). Such rows mostly wait (a peer process's
// start, a deadline, a freeze, a grace, a close), and a few at once keep a 2-core host's timing
// within the rows' margins: ucxRowsAtOnce for rows with 64 MiB pools or less, ucxBigRowsAtOnce
// for rows that hold 256 MiB or more in Go memory (which the race detector shadows, several
// times over).
const (
	ucxRowsAtOnce    = 3
	ucxBigRowsAtOnce = 2
)

// midTransfer is one request between this side's engine and an enginepeer process, caught
// while its bytes move on a path: what the tests that then kill or stop the peer
// (TestL9_UCXPeerKilledMidTransferOnEveryPath, TestL9_UCXPeerFrozenPastItsDeadlineOnEveryPath)
// work on.
type midTransfer struct {
	local      *ucxEngine
	peer       *peerproc.Proc
	k          *ucxKV // this side's pool
	h          *Handle
	localSends bool
}

// midTransferAttempts is how many times startMidTransfer sets a request up before it gives up
// on catching one mid-transfer: a read in place or by CMA moves 64 MiB in milliseconds, and a
// loaded host's test goroutine, or a peer it starved, may miss them.
const midTransferAttempts = 3

// startMidTransfer starts this side's engine with cfg on pc's path, in 4 MiB chunks, and an
// enginepeer (bin) on the same path, over tls and dev; this side sends want (enginepeer's pool
// for its -seed, ucxPeerArgs) when localSends, and receives it otherwise, as request id with
// timeout for its Spec.Timeout (0: cfg's). peerFlags go to the peer after the path's. It
// returns once the request's bytes move: the peer's pool is filled before the request starts,
// a receiving peer stops itself at its first bytes (-freeze) and says so, and this side,
// receiving, has seen some. A request that ended before is set up again, with a new engine
// and peer, up to midTransferAttempts times; then, with nothing to check, the test is skipped.
// The peers are killed at the test's end (peerproc).
func startMidTransfer(t *testing.T, bin, tls, dev string, pc ucxPathCase, cfg Config, localSends bool, id RequestID,
	want []byte, timeout time.Duration, peerFlags ...string) *midTransfer {
	t.Helper()
	cfg.Tuning.DirectChunkBytes = 4 << 20
	pc.cfg(&cfg)
	for a := 1; ; a++ {
		m, ended := tryMidTransfer(t, bin, tls, dev, pc, cfg, localSends, id, want, timeout, peerFlags)
		if m != nil {
			return m
		}
		if a == midTransferAttempts {
			t.Skipf("the request ended before its bytes were seen moving, %d times: nothing to check (last: %s)", a, ended)
		}
		t.Logf("attempt %d: the request ended before its bytes were seen moving (%s); again", a, ended)
	}
}

// tryMidTransfer is one attempt of startMidTransfer: the request caught moving, or nil and
// how it ended, its engine closed and its peer killed.
func tryMidTransfer(t *testing.T, bin, tls, dev string, pc ucxPathCase, cfg Config, localSends bool, id RequestID,
	want []byte, timeout time.Duration, peerFlags []string) (*midTransfer, string) {
	t.Helper()
	blocks := int64(len(want) / engineBlockBytes)
	m := &midTransfer{local: newUCXEngine(t, tls, dev, cfg), localSends: localSends}
	mode := "engine-send"
	if localSends {
		mode = "engine-recv"
	}
	args := append(ucxPeerArgs(tls, dev, mode, blocks, id, 120*time.Second), "-direct-chunk", strconv.Itoa(4<<20))
	args = append(args, pc.peer...)
	if localSends {
		args = append(args, "-freeze") // it stops itself at its first bytes
	}
	m.peer = peerproc.Start(t, bin, append(args, peerFlags...)...)
	m.peer.Connect(t, string(m.local.tr.Self()))
	m.k = pc.kv(t, m.local, engineDims(blocks), seqBlocks(0, int32(blocks)), 0)
	spec := Spec{ID: id, Peer: Peer(m.peer.Addr), Plan: m.k.plan, Pool: m.k.mem, Timeout: timeout}
	if localSends {
		copy(m.k.mem, want) // the bytes the peer checks
	}
	// The request starts once the peer's pool is filled: a deadline of a few hundred
	// milliseconds must not run out while a loaded host's peer fills 64 MiB.
	m.peer.Expect(t, "FILLED", 60*time.Second)
	var err error
	if localSends {
		m.h, err = m.local.e.Send(bg, spec)
		require.NoError(t, err)
		if m.peer.Expect(t, "FREEZE ", 60*time.Second) == "missed" {
			waitQuiesced(t, m.h, 30*time.Second)
			return nil, m.endAttempt(t, "the peer saw none")
		}
	} else {
		m.h, err = m.local.e.Receive(bg, spec)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return m.h.Status().Bytes > 0 || isClosed(m.h.Done()) }, 60*time.Second, 20*time.Microsecond,
			"bytes moving")
		if isClosed(m.h.Done()) {
			return nil, m.endAttempt(t, "none seen here")
		}
	}
	require.Equal(t, pc.want, m.h.Path())
	return m, ""
}

// endAttempt closes the engine of an attempt that caught nothing and kills its peer, and says
// how the request ended. Nothing of the attempt is checked, its Close's error included (as
// the test's cleanup closes an engine).
func (m *midTransfer) endAttempt(t *testing.T, seen string) string {
	t.Helper()
	ended := fmt.Sprintf("%s; %+v", seen, m.h.Status())
	_ = m.local.e.Close()
	_ = m.peer.Cmd.Process.Signal(syscall.SIGKILL) // it may have ended
	return ended
}
