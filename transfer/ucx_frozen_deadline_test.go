// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/peerproc"
	"github.com/kvxfer/kvxfer/layout"
)

// TestL9_UCXPeerFrozenPastItsDeadlineOnEveryPath is the hung peer: the peer process is stopped
// (SIGSTOP) while a request moves on the path (ucxCancelPaths), this side sending or receiving,
// and stays stopped past the request's deadline, so that this side aborts with operations the
// frozen peer holds (sends queued behind it, receives it had begun to fill, an exposure it
// reads) and quarantines. Then, before the quarantine's clock runs out, the peer is killed, as a
// liveness probe's restart does, or it resumes. A dead process touches no memory any more and
// UCX ends every operation with it (for shared memory, once kvxfer emptied the dead peer's
// receive FIFO: docs/ucx.md); a resumed one reads the abort and ends its side, quiescent with
// nothing poisoned there either. Either way every
// end becomes known: the request quiesces within the loss bound, Failed with its deadline's
// error, nothing is poisoned, no slot stays leased, and health is back. A receiver that reads a
// stopped sender's memory without it (RMA and CMA over shared memory) may complete instead: then
// with every byte. Or this side's engine is closed with the peer still frozen (a rolling
// restart of the survivor; shared memory only): Close returns within its bound, the request ends terminal or
// quarantined for good with its blocks poisoned, and no slot is lost (L1). While the peer is frozen past the deadline, Status, Path, Health and Cancel
// answer at once (L4), Cancel truthfully (L10). The killed rows failed on the RMA paths with the receiver frozen until the
// loss resolved a transfer already aborting (2026-11-29).
func TestL9_UCXPeerFrozenPastItsDeadlineOnEveryPath(t *testing.T) {
	const blocks = 32                       // 64 MiB, in 4 MiB gets or messages
	const deadline = 500 * time.Millisecond // the request's Spec.Timeout
	const lossBound = 10 * time.Second      // docs/ucx.md, "A killed peer"
	bin := peerproc.BuildEnginePeer(t)
	ids := seqBlocks(0, blocks)
	want := newUCXKV(t, engineDims(blocks), layout.BlockMajor, ids, 5).mem // enginepeer's -seed (ucxPeerArgs)
	// Each row has its own engine and peer process, and mostly waits: a few at once.
	rows := newRowGroup(t, ucxRowsAtOnce)
	defer rows.wait()
	for _, tr := range ucxLifecycleTransports {
		for _, pc := range ucxCancelPaths {
			if pc.shmOnly && !ucxShm(tr.name) {
				continue
			}
			for _, c := range []struct{ frozen, then string }{{"sender", "killed"}, {"receiver", "killed"}, {"sender", "resumed"}, {"receiver", "resumed"}, {"sender", "closed"}, {"receiver", "closed"}} {
				frozen := c.frozen
				rows.run(tr.name+"/"+pc.name+"/frozen "+frozen+"/"+c.then, func(t *testing.T) {
					if tr.name == "tcp" && c.then == "closed" {
						// A close with the peer frozen is Close's forced path, the same over TCP
						// (all 8 passed, 2026-11-29); shared memory, where UCX holds what a frozen
						// peer has not read, keeps it in make test's time.
						t.Skip("closing with the peer frozen: shared memory only in the suite")
					}
					if frozen == "receiver" && c.then != "resumed" && ucxEmulatedGetsMayCrash(tr.name, pc) {
						// This side answers the frozen reader's gets through UCX 1.22's emulation;
						// the replies its full FIFO does not take are purged by the kill or the
						// close, and UCX's purge of them crashed the process (ci23, and under gdb).
						t.Skip(ucxEmulatedGetsSkip)
					}
					if tr.name == "tcp" && frozen == "receiver" && c.then == "killed" && (pc.name == "pull" || pc.name == "rma") {
						// As in TestL9_UCXPeerKilledMidTransferOnEveryPath: UCX 1.13 may abort this
						// process when a peer whose gets over TCP it emulates dies with replies
						// pending. Shared memory covers these paths.
						t.Skip("UCX 1.13 may abort the process when a peer whose gets over TCP this worker emulates dies with replies pending")
					}
					cfg := ucxPeerTestConfig()
					cfg.ProgressDeadline = 200 * time.Millisecond
					// The kill comes after the deadline's abort, within the quarantine: long
					// enough that poison, if any, would be the engine's choice, not the clock's.
					cfg.Tuning.QuarantineTimeout = 30 * time.Second
					localSends := frozen == "receiver"
					var peerFlags []string
					if c.then == "resumed" {
						peerFlags = []string{"-quiesce-bound", "20s"} // its own verdict, once resumed
					}
					m := startMidTransfer(t, bin, tr.tls, tr.dev, pc, cfg, localSends, 710, want, deadline, peerFlags...)
					local, peer, k, h := m.local, m.peer, m.k, m.h
					defer func() { _ = peer.Cmd.Process.Signal(syscall.SIGKILL) }()
					if !localSends { // the sending peer stops now (a receiving one stopped itself at its first bytes)
						peer.Signal(t, syscall.SIGSTOP)
					}
					froze := time.Now()
					select { // the deadline ends it (or, a reader of the stopped sender's pool, every byte)
					case <-h.Done():
					case <-time.After(deadline + 20*time.Second):
						require.FailNow(t, "not done past its deadline with its peer frozen", "%+v", h.Status())
					}
					st := h.Status()
					t.Logf("%v after the freeze: %v, %d of %d bytes, quiesced %v (%v)", time.Since(froze).Round(time.Millisecond),
						st.State, st.Bytes, st.Total, isClosed(h.Quiesced()), st.Err)
					if st.State == Completed {
						if !localSends {
							require.True(t, bytes.Equal(want, k.mem), "a completed transfer has every byte right")
						}
					} else {
						// Failed, or Quarantined: failed for the caller, with operations the frozen
						// peer holds (its memory still pinned).
						require.Contains(t, []State{Failed, Quarantined}, st.State, "%v", st.Err)
						require.True(t, errors.Is(st.Err, ErrDeadline), "%v", st.Err)
					}
					time.Sleep(cfg.Tuning.CancelGrace + 100*time.Millisecond) // past the abort's grace: quarantined, if anything is held
					quiescedBefore := isClosed(h.Quiesced())
					// The peer still frozen, every call answers at once (L4), and Cancel's answer is
					// true (L10): FreeNow only with Quiesced closed.
					returnsAtOnce(t, "Status", func() { _ = h.Status() })
					returnsAtOnce(t, "Path", func() { _ = h.Path() })
					returnsAtOnce(t, "Health", func() { _ = local.e.Health() })
					var out CancelOutcome
					var quiescedAtCancel bool
					returnsAtOnce(t, "Cancel", func() { out = local.e.Cancel(710); quiescedAtCancel = isClosed(h.Quiesced()) })
					if out.FreeNow() {
						require.True(t, quiescedAtCancel, "Cancel answered %v with Quiesced open", out)
					} else if !quiescedAtCancel {
						require.Equal(t, NotCancellable, out, "a quarantined transfer")
					}
					if c.then == "closed" {
						closeWithPeerFrozen(t, local, h, cfg.CloseTimeout)
						return
					}
					sig := map[string]syscall.Signal{"killed": syscall.SIGKILL, "resumed": syscall.SIGCONT}[c.then]
					peer.Signal(t, sig)
					ended := time.Now()
					select {
					case <-h.Quiesced():
					case <-time.After(lossBound + 5*time.Second):
					}
					st = h.Status()
					t.Logf("quiesced before the %v %v; %v after it: quiesced %v, poisoned %v", sig, quiescedBefore,
						time.Since(ended).Round(time.Millisecond), isClosed(h.Quiesced()), st.BlocksPoisoned)
					require.False(t, st.BlocksPoisoned, "every end is known: %+v", st)
					require.True(t, isClosed(h.Quiesced()), "not quiesced %v after the %v: %+v", time.Since(ended), sig, st)
					require.True(t, st.State.Terminal(), "%+v", st)
					if st.State != Completed {
						require.Equal(t, Failed, st.State, "%v", st.Err)
					}
					eventually(t, func() bool { return local.e.pool.Stats().Leased == 0 }, "every slot lease ended")
					requireSlotsAccounted(t, local.e)
					require.Zero(t, local.e.pool.Stats().Poisoned, "staging slots poisoned")
					require.Zero(t, local.e.Health().Numbers.PoisonedBlocks)
					eventually(t, func() bool { return local.e.Health().Healthy }, "healthy once the request quiesced")
					if c.then == "resumed" {
						// The peer that was frozen ends its side too: done, quiescent, nothing poisoned.
						done := peer.Expect(t, "DONE ", 30*time.Second)
						q := peer.Expect(t, "QUIESCED ", 30*time.Second)
						t.Logf("the resumed peer: DONE %s, QUIESCED %s", done, q)
						require.Equal(t, "true 0 false", q, "the resumed peer quiesced, no slot or block poisoned (DONE %s)", done)
					}
				})
			}
		}
	}
}

// closeWithPeerFrozen closes u's engine while the peer of h, quarantined past its deadline, is
// still frozen: Close returns within closeTimeout and a margin for the transport's own close,
// h ends terminal or quarantined for good with its blocks poisoned (UCX keeps what the frozen
// peer holds until the worker is gone, L9), and no slot is lost (L1, L5).
func closeWithPeerFrozen(t *testing.T, u *ucxEngine, h *Handle, closeTimeout time.Duration) {
	t.Helper()
	start := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- u.e.Close() }()
	select {
	case err := <-closed:
		t.Logf("Close took %v with the peer frozen (%v)", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(closeTimeout + 20*time.Second):
		require.FailNow(t, "Close did not return with the peer frozen", "%v: %+v", time.Since(start), h.Status())
	}
	st := h.Status()
	require.True(t, isClosed(h.Done()), "%+v", st)
	require.True(t, st.State.Terminal() || st.State == Quarantined && st.BlocksPoisoned,
		"terminal, or quarantined for good with its blocks poisoned: %+v", st)
	requireSlotsAccounted(t, u.e)
}
