// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
)

// The prefill end reports a round's Sends in one message when the decode end asks, after the
// round, not one message per request as each ends: those were written inside the measured
// window (a marshal, a system call and a goroutine's wake per request, on the cores the
// transfers share). Every request asked is reported, a failed one with its error.
func TestPrefillEndReportsARoundsSendsWhenAsked(t *testing.T) {
	skipWithoutHostCopy(t)
	cases := []struct {
		desc    string
		failing map[uint64]bool // requests asked for a decode rank the prefill end does not hold
	}{
		{"every send ends well", nil},
		{"one send fails", map[uint64]bool{2: true}},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			cfg := smallRun(t, func(s *runSpec) { s.prompts, s.concurrency = []int64{64}, []int{3} })
			n := &fakeNet{slot: cfg.SlotBytes, sends: map[fakeKey]*fakeOp{}, recvs: map[fakeKey]*fakeOp{}}
			a, b := tcpPair(t)
			dc, pc := newControl(a, 5*time.Second), newControl(b, 5*time.Second)
			defer dc.Close()
			defer pc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			p, err := newPrefillEnd(cfg, 0, n.end("prefill0"), "decode")
			require.NoError(t, err)
			served := make(chan error, 1)
			go func() { served <- p.serve(ctx, pc) }()

			require.NoError(t, dc.send(message{Scenario: &scenarioMsg{Tokens: 64}}))
			m, err := dc.recvMessage(0)
			require.NoError(t, err)
			require.NotNil(t, m.Ready)
			decode := n.end("decode")
			blocks := blocksFor(Shape{Dims: cfg.Decode.Dims()}, 64)
			ids := []uint64{1, 2, 3}
			var waits []pendingXfer
			for i, id := range ids {
				req := reqMsg{ID: id}
				if tc.failing[id] {
					req.DecodeRank = 5
				} else {
					dst := make([]int32, blocks)
					for k := range dst {
						dst[k] = int32(int64(i)*blocks + int64(k))
					}
					plan, err := layout.NewPlan(cfg.Decode, cfg.Decode.All(), dst)
					require.NoError(t, err)
					h, err := decode.Receive(ctx, id, nil, []recvSub{{peer: "prefill0", plan: plan}}, &timedMover{pool: make([]byte, cfg.Decode.SpanBytes())})
					require.NoError(t, err)
					waits = append(waits, h)
				}
				require.NoError(t, dc.send(message{Req: &req}))
			}
			for _, h := range waits {
				select {
				case <-h.Done():
					require.NoError(t, h.Err())
				case <-ctx.Done():
					t.Fatal("a receive did not end")
				}
			}

			require.NoError(t, dc.send(message{Report: true}))
			m, err = dc.recvMessage(0)
			require.NoError(t, err)
			require.NotNil(t, m.Sent)
			require.Len(t, m.Sent.Sends, len(ids), "one message reports every request asked")
			for i, s := range m.Sent.Sends {
				require.Equal(t, ids[i], s.ID)
				if tc.failing[s.ID] {
					require.Contains(t, s.Err, "decode rank 5")
				} else {
					require.Empty(t, s.Err)
					require.Positive(t, s.GatherNs)
				}
			}
			// Asked again with nothing asked since, it reports nothing.
			require.NoError(t, dc.send(message{Report: true}))
			m, err = dc.recvMessage(0)
			require.NoError(t, err)
			require.NotNil(t, m.Sent, "an empty report is still a report")
			require.Empty(t, m.Sent.Sends)
			require.NoError(t, dc.send(message{Bye: true}))
			require.NoError(t, <-served)
		})
	}
}

// The decode end takes a prefill end's report only if it reports each request asked of it
// exactly once, and none failed: what a peer sends is checked, not obeyed.
func TestDecodeEndChecksThePrefillsReport(t *testing.T) {
	asked := []uint64{7, 8, 9}
	cases := []struct {
		desc    string
		got     []sentMsg
		wantErr string
		gather  int64
	}{
		{"every request once", []sentMsg{{ID: 7, GatherNs: 1}, {ID: 8, GatherNs: 2}, {ID: 9, GatherNs: 4}}, "", 7},
		{"in another order", []sentMsg{{ID: 9, GatherNs: 4}, {ID: 7, GatherNs: 1}, {ID: 8, GatherNs: 2}}, "", 7},
		{"one missing", []sentMsg{{ID: 7}, {ID: 8}}, "reported 2 sends of the 3 asked", 0},
		{"one extra", []sentMsg{{ID: 7}, {ID: 8}, {ID: 9}, {ID: 10}}, "reported 4 sends of the 3 asked", 0},
		{"one not asked", []sentMsg{{ID: 7}, {ID: 8}, {ID: 10}}, "request 10, which was not asked of it", 0},
		{"one twice", []sentMsg{{ID: 7}, {ID: 8}, {ID: 8}}, "request 8 twice", 0},
		{"one failed", []sentMsg{{ID: 7}, {ID: 8, Err: "peer gone"}, {ID: 9}}, "send 8: peer gone", 0},
		{"a negative gather time", []sentMsg{{ID: 7}, {ID: 8, GatherNs: -1}, {ID: 9}}, "request 8 gathered for -1 ns", 0},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			gather, err := checkSent(1, asked, tc.got)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				require.ErrorContains(t, err, "prefill rank 1")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.gather, gather)
		})
	}
}
