// SPDX-License-Identifier: Apache-2.0

package observe_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/observe"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// logsTo gives each engine its own LogObserver (it remembers requests by id, and both engines
// see the same ids), on one core, its lines named after the engine.
func logsTo(core zapcore.Core) func(string) transfer.Observer {
	return func(engine string) transfer.Observer { return observe.NewLogObserver(zap.New(core).Named(engine)) }
}

// fieldsOf returns an entry's fields by key, as the encoder would see them.
func fieldsOf(e observer.LoggedEntry) map[string]any { return e.ContextMap() }

// TestLogObserver_CompletedTransfer: a finished transfer leaves, at debug, its acceptance with
// direction, peer and size, and every state transition with the request id.
func TestLogObserver_CompletedTransfer(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	p := newPair(t, smallConfig(), logsTo(core))
	send, recv := p.start(t, 42, 3, 4)
	require.Equal(t, transfer.Completed, waitQuiesced(t, recv).State)
	require.Equal(t, transfer.Completed, waitQuiesced(t, send).State)
	size := p.plan(t, 3, 4).Bytes()

	accepted := logs.FilterMessage("transfer accepted").AllUntimed()
	require.Len(t, accepted, 2, "one per engine")
	dirs := map[string]any{}
	for _, e := range accepted {
		require.Equal(t, zapcore.DebugLevel, e.Level)
		f := fieldsOf(e)
		require.EqualValues(t, 42, f["request"])
		require.EqualValues(t, size, f["bytes"])
		dirs[f["direction"].(string)] = f["peers"]
	}
	require.Equal(t, map[string]any{"send": []any{"decode"}, "receive": []any{"prefill"}}, dirs)

	var toCompleted int
	for _, e := range logs.FilterMessage("transfer state").AllUntimed() {
		require.Equal(t, zapcore.DebugLevel, e.Level)
		f := fieldsOf(e)
		require.EqualValues(t, 42, f["request"])
		if f["sub"] == int64(-1) && f["to"] == "completed" {
			toCompleted++
		}
	}
	require.Equal(t, 2, toCompleted, "each side's handle logs its completion")
	require.Zero(t, logs.FilterLevelExact(zapcore.WarnLevel).Len(), "nothing to warn about")
}

// TestLogObserver_QuarantineAndPoisonWarnWithReason: a cancelled transfer whose chunk the
// transport never lets go is quarantined, then its slot poisoned; both at warn, with the
// request id and the reason.
func TestLogObserver_QuarantineAndPoisonWarnWithReason(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	cfg := smallConfig()
	cfg.Tuning.CancelGrace = 10 * time.Millisecond
	cfg.Tuning.QuarantineTimeout = 50 * time.Millisecond
	p := newPair(t, cfg, logsTo(core))
	p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
		return mem.Fault{Hang: fp.Kind == transport.KindData, NeverQuiesce: fp.Kind == transport.KindData}
	})
	_, recv := p.start(t, 9, 0, 1)
	// Two receives (PipelineDepth) matched by two sends: both chunks are on the wire, where a
	// cancel cannot reach them.
	eventually(t, waitBound, func() bool { return p.net.Pending() == 4 }, "both chunks on the wire")
	require.Equal(t, transfer.CancelRequestedInFlight, p.decode.Cancel(9))
	require.Equal(t, transfer.Cancelled, waitQuiesced(t, recv).State)

	cancel := logs.FilterMessage("transfer cancel").AllUntimed()
	require.NotEmpty(t, cancel)
	require.Equal(t, "cancel-requested-in-flight", fieldsOf(cancel[0])["outcome"])
	require.Equal(t, false, fieldsOf(cancel[0])["free_now"])
	for _, msg := range []string{"transfer quarantined: memory pinned until the transport lets go",
		"staging slot poisoned: out of circulation for good"} {
		entries := logs.FilterMessage(msg).FilterField(zap.Uint64("request", 9)).
			Filter(func(e observer.LoggedEntry) bool { return e.LoggerName == "decode" }).AllUntimed()
		require.NotEmpty(t, entries, msg)
		require.Equal(t, zapcore.WarnLevel, entries[0].Level)
		f := fieldsOf(entries[0])
		require.NotEmpty(t, f["reason"], "%s carries a reason", msg)
		require.Equal(t, "receive", f["direction"], msg)
		require.EqualValues(t, p.plan(t, 0, 1).Bytes(), f["bytes"], msg)
		if f["peer"] == nil {
			require.Equal(t, []any{"prefill"}, f["peers"], msg)
		} else {
			require.Equal(t, "prefill", f["peer"], msg)
		}
	}
	require.Equal(t, 1.0, value(t, p.reg, "kvxfer_quarantines_total", map[string]string{"engine": "decode"}))
	require.Positive(t, value(t, p.reg, "kvxfer_staging_slots_poisoned", map[string]string{"engine": "decode"}))
}

func TestLogObserver_PeersAndNilLogger(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	obs := observe.NewLogObserver(zap.New(core))
	l, ok := obs.(observe.PeerObserver)
	require.True(t, ok, "the log observer hears of peers")
	obs.OnProgress(1, 10, time.Now())
	l.OnPeerConnected("10.0.0.2:7000")
	l.OnPeerLost("10.0.0.2:7000", transfer.ErrPeerLost)
	all := logs.AllUntimed()
	require.Len(t, all, 2, "progress is not logged")
	require.Equal(t, zapcore.DebugLevel, all[0].Level)
	require.Equal(t, zapcore.WarnLevel, all[1].Level)
	require.Equal(t, "10.0.0.2:7000", fieldsOf(all[1])["peer"])
	require.Contains(t, fieldsOf(all[1])["reason"], "peer lost")

	quiet := observe.NewLogObserver(nil) // must not panic
	quiet.OnPoison(1, 2, "x")
	quiet.(observe.StartObserver).OnStart(transfer.StartInfo{ID: 1})
}

// Every line the log observer writes names a peer by its short name (transport.Peer.Short),
// never by the whole peer: a UCX peer is its worker address in hex, hundreds of characters.
func TestLogObserver_PeersAreShortInEveryLine(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	obs := observe.NewLogObserver(zap.New(core))
	long := transfer.Peer(strings.Repeat("0a1b2c3d", 50)) // 400 hex digits, as a UCX worker address
	obs.(observe.StartObserver).OnStart(transfer.StartInfo{ID: 7, Receive: true, Peers: []transfer.Peer{long, long + "ff"}, Bytes: 1})
	obs.OnQuarantine(7, 0, transfer.ErrPeerLost)
	obs.OnPoison(7, 3, "x")
	obs.(observe.PeerObserver).OnPeerLost(long, transfer.ErrPeerLost)
	all := logs.AllUntimed()
	require.Len(t, all, 4)
	for _, e := range all {
		var names []string
		if p, ok := fieldsOf(e)["peer"].(string); ok {
			names = append(names, p)
		}
		if ps, ok := fieldsOf(e)["peers"].([]any); ok {
			for _, p := range ps {
				names = append(names, p.(string))
			}
		}
		require.NotEmpty(t, names, "%q names its peer", e.Message)
		for _, n := range names {
			require.LessOrEqual(t, len(n), 64, "%q: peer %q", e.Message, n)
		}
	}
	require.Equal(t, []any{long.Short(), (long + "ff").Short()}, fieldsOf(all[0])["peers"])
}
