// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

func TestConfigErrorsNameTheField(t *testing.T) {
	cases := []struct {
		desc  string
		cfg   Config
		field string
	}{
		{"fraction above one", Config{CancelFraction: 1.5}, "CancelFraction"},
		{"negative fraction", Config{LargeFraction: -0.1}, "LargeFraction"},
		{"direct fraction above one", Config{DirectFraction: 2}, "DirectFraction"},
		{"negative duration", Config{Grace: -time.Second}, "Grace"},
		{"too short", Config{Duration: time.Second}, "Duration"},
		{"concurrency", Config{Concurrency: -1}, "Concurrency"},
		{"slot too small", Config{SlotBytes: 100}, "SlotBytes"},
		{"freeze shorter than the progress deadline", Config{FreezeFor: time.Second, ProgressDeadline: 2 * time.Second}, "FreezeFor"},
		{"loss over half the packets", Config{LossPercent: 60}, "LossPercent"},
		{"a third prefill process to hang", Config{HungPeerFirst: 2}, "HungPeerFirst"},
		{"negative drain deadline", Config{DrainFor: -time.Second}, "DrainFor"},
		{"negative dead-peer bound", Config{DeadPeerBound: -time.Second}, "DeadPeerBound"},
		{"dead-peer without lost-peer", Config{Faults: []Fault{FaultDeadPeer}}, "Faults"},
		{"freeze-paths without freeze", Config{Faults: []Fault{FaultFreezePaths}}, "Faults"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			err := c.cfg.withDefaults().validate()
			require.ErrorIs(t, err, ErrInvalidConfig)
			var ce *ConfigError
			require.True(t, errors.As(err, &ce))
			require.Equal(t, c.field, ce.Field)
		})
	}
	require.NoError(t, Config{}.withDefaults().validate(), "the defaults must validate")
}

func TestParseFaults(t *testing.T) {
	cases := []struct {
		desc string
		in   string
		want []Fault
		bad  bool
	}{
		{"all", "all", AllFaults, false},
		{"none", "none", nil, false},
		{"empty", "", nil, false},
		{"two, deduplicated", "freeze, cancel,freeze", []Fault{FaultFreeze, FaultCancel}, false},
		{"unknown", "cancel,meteor", nil, true},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			got, err := ParseFaults(c.in)
			if c.bad {
				require.ErrorIs(t, err, ErrInvalidConfig)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
}

func TestParseRoutes(t *testing.T) {
	cases := []struct {
		desc string
		in   string
		want []Route
		bad  bool
	}{
		{"all", "all", AllRoutes, false},
		{"empty means all", "", AllRoutes, false},
		{"some, deduplicated", "rma, cma,rma", []Route{RouteRMA, RouteCMA}, false},
		{"unknown", "rdma", nil, true},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			got, err := ParseRoutes(c.in)
			if c.bad {
				require.ErrorIs(t, err, ErrInvalidConfig)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
}

// A failed transfer's error must say what happened in terms a caller can act on: a kvxfer
// sentinel, however deeply wrapped.
func TestErrorClassNamesTheSentinel(t *testing.T) {
	cases := []struct {
		desc string
		err  error
		want string
	}{
		{"no error", nil, "-"},
		{"deadline, wrapped", fmt.Errorf("request 7: %w", transfer.ErrDeadline), "deadline"},
		{"peer lost, wrapped twice", fmt.Errorf("sub 1: %w", fmt.Errorf("request 7: %w", transfer.ErrPeerLost)), "peer-lost"},
		{"quarantined before its cause", fmt.Errorf("%w: %w", transfer.ErrQuarantined, transfer.ErrDeadline), "quarantined"},
		{"stale RMA read", fmt.Errorf("request 3: %w", transfer.ErrStaleRead), "stale-read"},
		{"a bare string", errors.New("something broke"), untypedError},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			require.Equal(t, c.want, errorClass(c.err))
		})
	}
}

// Windows of a registered pool never overlap, run out rather than share, and come back.
func TestWindowsNeverShareBlocks(t *testing.T) {
	mem := make([]byte, 3*4096)
	w := newWindows(mem, 4096, 3)
	seen := map[int]bool{}
	for range 3 {
		i, b, ok := w.take()
		require.True(t, ok)
		require.False(t, seen[i], "window %d handed out twice", i)
		seen[i] = true
		require.Len(t, b, 4096)
		require.Equal(t, cap(b), 4096, "a window must not reach into the next")
	}
	_, _, ok := w.take()
	require.False(t, ok, "a fourth window from three")
	w.put(1)
	i, _, ok := w.take()
	require.True(t, ok)
	require.Equal(t, 1, i)
	require.Zero(t, Config{}.withDefaults().windowBytes()%4096, "windows must start on pages for RegisterHost")
}

// nopTransport accepts every post and never completes it: enough for the tracker, which only
// looks at the buffers.
type nopTransport struct{}

func (nopTransport) Bind(transport.Inbound) error            { return nil }
func (nopTransport) SendControl(transfer.Peer, []byte) error { return nil }
func (nopTransport) Cancel(transport.OpID)                   {}
func (nopTransport) Progress(time.Duration) bool             { return false }
func (nopTransport) Close(bool) error                        { return nil }
func (nopTransport) PostSend(transfer.Peer, transport.Tag, []byte, func(transport.Completion)) (transport.OpID, error) {
	return 1, nil
}
func (nopTransport) PostRecv(transfer.Peer, transport.Tag, []byte, func(transport.Completion)) (transport.OpID, error) {
	return 1, nil
}

// The checker must catch the breach it exists for: a post into a slot after that slot was
// poisoned, by index, whatever part of the slot the buffer starts at.
func TestL5_SlotTrackerCatchesAPoisonedSlotReused(t *testing.T) {
	const slot = 1024
	staging := make([]byte, 8*slot)
	tr := newSlotTracker(nopTransport{}, staging, slot)
	cases := []struct {
		desc   string
		buf    []byte
		send   bool
		reused int
	}{
		{"a healthy slot", staging[2*slot : 3*slot], true, 0},
		{"the poisoned slot, from its start", staging[3*slot : 4*slot], true, 1},
		{"the poisoned slot, a receive", staging[3*slot : 3*slot+100], false, 2},
		{"the next slot", staging[4*slot : 5*slot], false, 2},
	}
	tr.markPoisoned(3)
	for _, c := range cases {
		var err error
		if c.send {
			_, err = tr.PostSend("p", transport.Tag{Request: 9}, c.buf, nil)
		} else {
			_, err = tr.PostRecv("p", transport.Tag{Request: 9}, c.buf, nil)
		}
		require.NoError(t, err, c.desc)
		poisoned, reused, foreign := tr.findings()
		require.Equal(t, 1, poisoned, c.desc)
		require.Len(t, reused, c.reused, c.desc)
		require.Empty(t, foreign, c.desc)
	}
	_, err := tr.PostSend("p", transport.Tag{Request: 10}, make([]byte, 10), nil)
	require.NoError(t, err)
	_, _, foreign := tr.findings()
	require.Len(t, foreign, 1, "a buffer outside the staging memory is reported")
}

// A run that injected nothing it was asked to, or that saw a wedged handle, fails, and its
// report says why in both forms.
func TestReportFailsOnEveryBreachKind(t *testing.T) {
	cases := []struct {
		desc   string
		mutate func(s *soak)
		want   string
	}{
		{"a fault never injected", func(s *soak) {}, "fault freeze was enabled but never injected"},
		{"a wedged handle", func(s *soak) { s.injected[FaultFreeze].Add(1); s.wedged.Add(1) }, "1 handles wedged"},
		{"a corrupt transfer", func(s *soak) { s.injected[FaultFreeze].Add(1); s.corrupt.Add(2) }, "2 completed transfers corrupt"},
		{"a recorded breach", func(s *soak) { s.injected[FaultFreeze].Add(1); s.addBreach("engine x: boom") }, "engine x: boom"},
		{"a handle forgotten while not quiescent", func(s *soak) { s.injected[FaultFreeze].Add(1); s.releasedUnquiesced.Add(1) },
			"1 handles released while not quiescent, but their engines remember 0: a handle was forgotten"},
		{"no unhealthy time while a silent peer failed every request", func(s *soak) { s.injected[FaultFreeze].Add(1); s.silentRan.Store(true) }, silentBreach},
		{"a live heap over the bound", func(s *soak) { s.injected[FaultFreeze].Add(1); s.maxLiveHeap.Store(s.cfg.MaxHeapBytes + 1) },
			fmt.Sprintf("live heap reached %d bytes, over the %d-byte bound", DefaultMaxHeapBytes+1, uint64(DefaultMaxHeapBytes))},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			s, err := newSoak(Config{Faults: []Fault{FaultFreeze}})
			require.NoError(t, err)
			defer s.closeAll()
			s.started.Add(1)
			c.mutate(s)
			rep := s.report(1, 1)
			require.False(t, rep.Passed)
			require.Contains(t, rep.Breaches, c.want)

			var js bytes.Buffer
			require.NoError(t, rep.WriteJSON(&js))
			var m map[string]any
			require.NoError(t, json.Unmarshal(js.Bytes(), &m))
			for _, k := range []string{"started", "completed", "cancelled", "cancel_outcomes", "quarantined", "poisoned_slots",
				"wedged", "leaked_slots", "corrupt", "reused_poisoned", "seconds_unhealthy", "longest_recovery_seconds",
				"faults_injected", "max_live_heap_bytes", "breaches", "passed", "poisoned_blocks", "poisoned_block_budget",
				"remembered_unquiesced", "silent_unhealthy_seconds"} {
				require.Contains(t, m, k)
			}
			var table bytes.Buffer
			require.NoError(t, rep.WriteTable(&table))
			require.Contains(t, table.String(), "FAIL")
			require.Contains(t, table.String(), c.want)
		})
	}
}

const silentBreach = "an engine whose requests to a silent peer failed one after another, no byte moving, never reported unhealthy"

// L12 in the soak: requests issued one after another to a silent peer, no byte moving, must
// show unhealthy time, and the check fails a run whose engine never says so (here one whose
// progress deadline is too long to trip).
func TestL12_SilentPeerCheckCatchesAnEngineThatStaysHealthy(t *testing.T) {
	for _, c := range []struct {
		desc     string
		deadline time.Duration // the checked engine's ProgressDeadline; 0: the soak's
		breach   bool
	}{
		{"the soak's progress deadline: unhealthy", 0, false},
		{"a deadline of an hour: never unhealthy, a breach", time.Hour, true},
	} {
		t.Run(c.desc, func(t *testing.T) {
			cfg := shortSoak(5 * time.Second)
			cfg.Faults = []Fault{FaultFreeze}
			s, err := newSoak(cfg)
			require.NoError(t, err)
			defer s.closeAll()
			d := c.deadline
			if d == 0 {
				d = s.cfg.ProgressDeadline
			}
			s.silentPeer(context.Background(), d)
			s.started.Add(1)
			s.injected[FaultFreeze].Add(1)
			rep := s.report(1, 1)
			require.Equal(t, c.breach, slices.Contains(rep.Breaches, silentBreach), "%v", rep.Breaches)
			if !c.breach {
				require.Positive(t, rep.SilentUnhealthySeconds)
				require.Empty(t, rep.Breaches)
			}
		})
	}
}

// The soak checksums a stream a chunk at a time to keep its allocation down; the sum must be
// the CRC-32 of the whole stream, for streams shorter and longer than a chunk.
func TestChecksumChunkedMatchesWholeStream(t *testing.T) {
	for _, tokens := range []int64{16, 4096} {
		l := layout.Packed(layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 256}, layout.BlockMajor)
		blocks := make([]int32, tokens/16)
		for i := range blocks {
			blocks[i] = int32(len(blocks) - 1 - i)
		}
		p, err := layout.NewPlan(l, l.All(), blocks)
		require.NoError(t, err)
		pool := make([]byte, l.SpanBytes())
		_, _ = rand.NewChaCha8([32]byte{1}).Read(pool)
		whole := make([]byte, p.Bytes())
		require.NoError(t, native.HostGather(p, pool, 0, whole))
		require.Equal(t, crc32.ChecksumIEEE(whole), checksum(p, pool), "tokens %d (%d bytes)", tokens, p.Bytes())
	}
}
