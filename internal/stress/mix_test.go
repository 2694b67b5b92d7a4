// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package stress

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/internal/peerproc/proc"
	"github.com/kvxfer/kvxfer/internal/transportimpl"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// The engine picks its paths by asking its transport for optional capabilities; a soak whose
// wrapper hides one runs paths no serving process runs (every peer-process request went by
// plain staging while the wrapper was a slotTracker). The UCX wrapper must offer every
// capability the engine asks for that the implementation behind *ucx.Transport has.
func TestUCXTracked_KeepsEveryCapabilityTheEngineAsksFor(t *testing.T) {
	capabilities := []struct {
		desc  string
		iface reflect.Type
	}{
		{"direct (IOV messages)", reflect.TypeFor[transport.DirectTransport]()},
		{"RMA gets", reflect.TypeFor[transport.RMATransport]()},
		{"RMA emulation (TCP)", reflect.TypeFor[transport.RMAEmulation]()},
		{"remote keys prepared ahead", reflect.TypeFor[transport.RMAKeyPreparer]()},
		{"reads in place", reflect.TypeFor[transport.RMAMapper]()},
		{"lanes", reflect.TypeFor[transport.RMALanes]()},
		{"generation words (pull wire, validated reads)", reflect.TypeFor[transport.RMAGenerations]()},
		{"pool holds", reflect.TypeFor[transport.PoolHolder]()},
		{"tag reservation (drains)", reflect.TypeFor[transport.TagReserver]()},
		{"transport health (receive probe)", reflect.TypeFor[transport.TransportHealth]()},
		{"control room", reflect.TypeFor[transport.ControlBound]()},
		{"large segments (TCP)", reflect.TypeFor[transport.LargeSegmentSender]()},
		{"device gets", reflect.TypeFor[transport.DeviceRMATransport]()},
	}
	tr, err := ucx.New(ucx.Config{})
	require.NoError(t, err)
	defer tr.Close(true)
	raw, tracked := reflect.TypeOf(transportimpl.Of(tr)), reflect.TypeFor[*ucxTracked]()
	for _, c := range capabilities {
		t.Run(c.desc, func(t *testing.T) {
			require.Equal(t, raw.Implements(c.iface), tracked.Implements(c.iface),
				"the UCX transport implements %v: %v; the soak's wrapper: %v", c.iface, raw.Implements(c.iface), tracked.Implements(c.iface))
		})
	}
}

// A peer that exits other than with status 0 (a signal the soak did not send, a Go panic's
// exit 2) is a crash, and a breach; one that exits 0 is not.
func TestProcessSoak_APeerThatCrashesIsABreach(t *testing.T) {
	cases := []struct {
		desc    string
		script  string
		crashed bool
	}{
		{"exits 0 after its drain", "exit 0", false},
		{"segfaults", "kill -SEGV $$", true},
		{"panics (exit 2)", "exit 2", true},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			ps := &procSoak{soak: &soak{log: zap.NewNop()}}
			child, err := proc.Start(context.Background(), exec.Command("sh", "-c", c.script), proc.Options{})
			require.NoError(t, err)
			require.True(t, child.Reap(10*time.Second))
			ps.checkExit(&procPeer{child: child})
			if c.crashed {
				require.EqualValues(t, 1, ps.crashes.Load())
				require.Len(t, ps.breach, 1)
				require.Contains(t, ps.breach[0], "crashed")
			} else {
				require.Zero(t, ps.crashes.Load())
				require.Empty(t, ps.breach)
			}
		})
	}
}

// The lossy link drops packets at random with nftables in both namespaces and limits the rate
// with tbf; cleaning it undoes every step.
func TestLossyLinkCommands(t *testing.T) {
	n := &netPair{nsA: "kvxs1a", nsB: "kvxs1b", devA: "kvxs1a0", devB: "kvxs1b0"}
	var joined []string
	for _, c := range n.lossyCommands(5) {
		joined = append(joined, strings.Join(c, " "))
	}
	all := strings.Join(joined, "\n")
	for _, ns := range []string{n.nsA, n.nsB} {
		require.Contains(t, all, "ip netns exec "+ns+" nft add rule inet kvxsoak out numgen random mod 100 < 5 drop")
	}
	require.Contains(t, all, "tc -n kvxs1a qdisc add dev kvxs1a0 root tbf rate 1gbit")
	var undo []string
	for _, c := range n.clearLossCommands() {
		undo = append(undo, strings.Join(c, " "))
	}
	require.Equal(t, []string{
		"ip netns exec kvxs1a nft delete table inet kvxsoak",
		"ip netns exec kvxs1b nft delete table inet kvxsoak",
		"tc -n kvxs1a qdisc del dev kvxs1a0 root",
	}, undo)
}

// The peer-process mix moves bytes on every path a serving process has: staging, the pull
// wire, direct IOV messages, RMA gets from a UCX-allocated pool, and RMA from a pool the
// sender mapped and registered itself (process_vm_readv over shared memory).
func TestProcessSoak_MixMovesEveryPath(t *testing.T) {
	if os.Getenv("STRESS_TLS") != "" {
		t.Skip("STRESS_TLS names the transports by hand: gets may be emulated (TCP), and the engines then take other paths by design")
	}
	cfg := shortSoak(8 * time.Second)
	cfg.Concurrency = 16
	cfg.NoFaults = true
	// No request may miss its deadline on a loaded host under -race: a direct-path send whose
	// receiver gave up poisons its blocks (docs/stress.md, "What the new checks found"), and
	// with no fault on that is a breach this test is not about.
	cfg.TransferTimeout, cfg.QueueTimeout = 20*time.Second, 20*time.Second
	rep, err := RunProcesses(context.Background(), cfg, "", "")
	require.NotNil(t, rep, "%v", err)
	var table bytes.Buffer
	require.NoError(t, rep.WriteTable(&table))
	t.Log("\n" + table.String())
	require.NoError(t, err)
	for _, path := range []string{"staging", "staging-pull", "direct", "rma", "rma-host"} {
		require.Positive(t, rep.CompletedByPath[path], "path %s", path)
	}
	if len(rep.Skipped) == 0 {
		require.Positive(t, rep.CMAReads, "the CMA route completed without a process_vm_readv read")
	}
}
