// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package stress

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// TestMain lets this test binary serve as the peer process of the process-mode soak.
func TestMain(m *testing.M) {
	if code, ran := RunPeerFromEnv(); ran {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// Two prefill processes over UCX feed one decode engine here (TP=1 and TP=2 requests); both are
// stopped with SIGSTOP and resumed with SIGCONT, one is killed with SIGKILL and restarted, the
// link is cut and restored; every invariant holds, and decode is healthy again within the
// recovery bound after each.
func TestProcessSoakWithSignalsHoldsEveryInvariant(t *testing.T) {
	cfg := shortSoak(20 * time.Second)
	cfg.Concurrency = 32
	cfg.Faults = []Fault{FaultCancel, FaultDeadline, FaultFreeze, FaultLostPeer, FaultPartition}
	if testing.Verbose() {
		cfg.Logger = zap.NewExample()
	}
	rep, err := RunProcesses(context.Background(), cfg, os.Getenv("STRESS_TLS"), "")
	require.NotNil(t, rep, "%v", err)
	var table bytes.Buffer
	require.NoError(t, rep.WriteTable(&table))
	t.Log("\n" + table.String())
	require.NoError(t, err)
	require.Positive(t, rep.Completed)
	for _, f := range cfg.Faults {
		require.Positive(t, rep.FaultsInjected[f], "fault %s", f)
	}
}

// The freeze, focused: the prefill processes are stopped (SIGSTOP) for longer than decode's
// transfer deadline and UCX's keepalive, under a cancel storm, then resumed (SIGCONT). Decode's
// receives time out during the stop, so every chunk the resumed senders still send arrives
// for a cancelled receive. Decode must be healthy within a few seconds of SIGCONT, and the
// stranded chunks must not cost the senders their slots: before the UCX transport drained
// cancelled receives' tags, such sends never completed, every prefill slot ended poisoned
// (288 of 288 in a 20 s run) and decode moved no byte until a peer restarted; before a
// receiver aborted while awaiting the sender's decline posted (and cancelled) the receives the
// decline would have, 144 slots in 12 s.
func TestProcessSoak_FreezeRecoversWithoutPoisoningSenders(t *testing.T) {
	cfg := shortSoak(12 * time.Second)
	cfg.Concurrency = 32
	cfg.FreezeFor = 3 * time.Second // past TransferTimeout (2s) and keepalive (200ms)
	cfg.RecoveryBound = 3 * time.Second
	cfg.Faults = []Fault{FaultCancel, FaultFreeze}
	// The tagged data messages only (prefill 1, Go pools, TP=1): the drains are theirs. Decode
	// asks for the pull wire and prefill 1 declines, so a receive cancelled before the decline
	// came must leave drains too (it once cost 144 slots here: docs/stress.md).
	cfg.Routes = []Route{RouteStaging}
	cfg.TPFraction = 1e-9
	if testing.Verbose() {
		cfg.Logger = zap.NewExample()
	}
	rep, err := RunProcesses(context.Background(), cfg, os.Getenv("STRESS_TLS"), "")
	require.NotNil(t, rep, "%v", err)
	var table bytes.Buffer
	require.NoError(t, rep.WriteTable(&table))
	t.Log("\n" + table.String())
	require.NoError(t, err)
	require.Positive(t, rep.FaultsInjected[FaultFreeze])
	require.Positive(t, rep.Completed)
	// Three engines of 2*MaxConcurrent+16 slots each; a few poisons are a sender's chunk that
	// outran every drain, a pool's worth is the defect.
	slots := int64(3 * (2*cfg.MaxConcurrent + 16))
	require.Less(t, rep.PoisonedSlots, slots/10, "slots poisoned over %d: late chunks stranded their senders", slots)
}

// The dead peer, focused: a prefill process is killed (SIGKILL), and once decode has heard it
// is lost, a Receive from it and a Send to it must each fail within DeadPeerBound (1 s), the
// done-when of a soak's dead-peer fault. A Send used to wait out QueueTimeout.
func TestProcessSoak_RequestsToADeadPeerFailWithinTheBound(t *testing.T) {
	cfg := shortSoak(10 * time.Second)
	cfg.Concurrency = 16
	cfg.Faults = []Fault{FaultLostPeer, FaultDeadPeer}
	if testing.Verbose() {
		cfg.Logger = zap.NewExample()
	}
	rep, err := RunProcesses(context.Background(), cfg, os.Getenv("STRESS_TLS"), "")
	require.NotNil(t, rep, "%v", err)
	var table bytes.Buffer
	require.NoError(t, rep.WriteTable(&table))
	t.Log("\n" + table.String())
	require.NoError(t, err)
	require.Positive(t, rep.FaultsInjected[FaultDeadPeer])
	require.GreaterOrEqual(t, rep.DeadPeerRequests, 4*rep.FaultsInjected[FaultDeadPeer], "two Receives and two Sends per dead peer")
	require.Less(t, rep.LongestDeadPeerSeconds, DefaultDeadPeerBound.Seconds())
}

// The hung peer, focused: a prefill process is stopped (SIGSTOP) past decode's deadline and
// cancel grace, so decode's transfers with it (its receives, and its RMA sends of route
// rma-send, whose exposed blocks the stopped process reads) abort, and those whose operations
// it holds quarantine; it is then killed (SIGKILL) before their quarantine runs out, as a
// supervisor kills a hung pod, and started again. Decode must end every one of those handles
// within the loss bound after the kill, and poison nothing of theirs once it heard the peer
// was lost. Before a transfer already aborting resolved on its peer's loss (2026-11-29), the
// quarantined rma-send handles waited out their quarantine, decode's blocks held. The rows
// are TP=1, each hanging the prefill process its routes take: prefill 0 for the RMA routes,
// prefill 1 for the direct route, whose IOV receives, where they had matched the hung sender's
// rendezvous, stayed with UCX after its death and were poisoned before the dead peer's sysv
// FIFO was emptied (2026-11-29; docs/stress.md, "The hung peer").
func TestL9_ProcessSoakHungPeerKilledLeavesDecodeNothingPoisoned(t *testing.T) {
	for _, c := range []struct {
		desc        string
		routes      []Route
		concurrency int
		hung        int  // the prefill process hung (Config.HungPeerFirst)
		large       bool // the most blocks a request has, to be read when the peer stops
		// needQuarantined: the row is there for the transfers in quarantine at the kill. Only
		// an RMA send being read when the peer stops, or a direct receive that matched its
		// message, quarantines (1 to 27 RMA sends of 125 here, fewest under -race; 0 to 23
		// direct receives), so a run that caught none checked nothing the fix changed, and the
		// row runs again, three runs at most.
		needQuarantined bool
	}{
		{"rma-send: decode the RMA sender the hung process reads", []Route{RouteRMASend}, 64, 0, true, true},
		{"direct: decode receives from the hung process", []Route{RouteDirect}, 32, 1, false, true},
		{"every route of the hung process", []Route{RoutePull, RouteRMA, RouteCMA, RouteRMASend}, 32, 0, false, false},
	} {
		t.Run(c.desc, func(t *testing.T) {
			cfg := shortSoak(10 * time.Second)
			cfg.Concurrency, cfg.MaxConcurrent = c.concurrency, c.concurrency
			if c.large {
				cfg.LargeFraction = 1
			}
			cfg.Faults = []Fault{FaultHungPeer}
			cfg.Routes = c.routes
			cfg.TPFraction = 1e-9
			cfg.HungPeerFirst = c.hung
			if testing.Verbose() {
				cfg.Logger = zap.NewExample()
			}
			var rep *Report
			for run := 1; run <= 3; run++ {
				var err error
				rep, err = RunProcesses(context.Background(), cfg, os.Getenv("STRESS_TLS"), "")
				require.NotNil(t, rep, "%v", err)
				var table bytes.Buffer
				require.NoError(t, rep.WriteTable(&table))
				t.Logf("run %d:\n%s", run, table.String())
				require.NoError(t, err)
				require.Equal(t, int64(1), rep.FaultsInjected[FaultHungPeer])
				// Not vacuous: decode had handles with the hung peer on every route.
				for _, r := range c.routes {
					require.Positive(t, rep.HungPeerHandles[string(r)], "route %s: %v", r, rep.HungPeerHandles)
				}
				require.Less(t, rep.LongestHungPeerQuiesceSeconds, hungPeerLossBound.Seconds())
				if !c.needQuarantined || rep.HungPeerQuarantined > 0 {
					break
				}
			}
			if c.needQuarantined && rep.HungPeerQuarantined == 0 {
				// About one run in three catches none (fewest under -race): three in a row is rare,
				// and says nothing about the fix either way.
				t.Skip("no transfer was in quarantine at the kill in three runs: nothing the fix changed was checked")
			}
		})
	}
}
