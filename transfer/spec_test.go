// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
)

// TestMultiPeerReceiveRefusesOverlappingSubs: two sub-transfers that would write the same
// bytes of the caller's pool are refused like a block listed twice in one plan, before
// anything is leased or registered: the id stays free and the pool untouched.
func TestMultiPeerReceiveRefusesOverlappingSubs(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig())
	dst := newKVPool(t, testDims, layout.LayerMajorNHD, nil, blocks(4, 5, 6), 0)
	sel := func(l0, l1, h0, h1 int64) layout.Selection {
		return layout.Selection{LayerBegin: l0, LayerEnd: l1, HeadBegin: h0, HeadEnd: h1}
	}
	plan := func(s layout.Selection, ids ...int32) *layout.Plan {
		pl, err := layout.NewPlan(dst.l, s, ids)
		require.NoError(t, err)
		return pl
	}
	cases := []struct {
		desc  string
		subs  []SubSpec
		field string // "" when the subs are disjoint and must be accepted
	}{
		{"the same blocks and heads", []SubSpec{{"a", plan(sel(0, 2, 0, 4), 4, 5)}, {"b", plan(sel(0, 2, 0, 4), 4, 5)}}, "Subs[1].Plan"},
		{"one shared block", []SubSpec{{"a", plan(sel(0, 2, 0, 4), 4, 5)}, {"b", plan(sel(0, 2, 0, 4), 6, 5)}}, "Subs[1].Plan"},
		{"overlapping heads", []SubSpec{{"a", plan(sel(0, 2, 0, 3), 4)}, {"b", plan(sel(0, 2, 2, 4), 4)}, {"c", plan(sel(0, 2, 0, 4), 6)}}, "Subs[1].Plan"},
		{"the third against the first", []SubSpec{{"a", plan(sel(0, 1, 0, 4), 4)}, {"b", plan(sel(1, 2, 0, 4), 4)}, {"c", plan(sel(0, 1, 1, 2), 4)}}, "Subs[2].Plan"},
		{"disjoint heads of the same blocks", []SubSpec{{"a", plan(sel(0, 2, 0, 2), 4, 5)}, {"b", plan(sel(0, 2, 2, 4), 4, 5)}}, ""},
		{"disjoint layers of the same blocks", []SubSpec{{"a", plan(sel(0, 1, 0, 4), 4, 5)}, {"b", plan(sel(1, 2, 0, 4), 4, 5)}}, ""},
	}
	for i, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			id := RequestID(100 + i)
			h, err := p.dst.Receive(bg, Spec{ID: id, Subs: c.subs, Pool: dst.mem})
			if c.field == "" {
				require.NoError(t, err)
				require.Contains(t, []CancelOutcome{CancelledBeforeAdvertise, CancelRequestedInFlight}, p.dst.Cancel(id))
				waitClosed(t, h.Quiesced(), "cancelled")
				require.NoError(t, h.Release())
				return
			}
			require.ErrorIs(t, err, ErrInvalidSpec)
			require.ErrorIs(t, err, layout.ErrDuplicateBlock)
			var se *specError
			require.ErrorAs(t, err, &se)
			require.Equal(t, c.field, se.Field)
			require.Equal(t, NotFound, p.dst.Cancel(id), "a refused receive leaves nothing registered")
			requireSlotsAccounted(t, p.dst)
		})
	}
}

// overlappingSubs decides subs of one layout by their selections and blocks; it finds the same
// pair the walk of their pool runs finds, over random TP splits, layer splits and block lists
// in every order.
func TestOverlappingSubsBySelectionMatchesTheRunWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 26))
	walk := func(subs []SubSpec) (int, int, bool) { // the run walk, with no shortcut
		for j := 1; j < len(subs); j++ {
			for i := range j {
				seen := map[int64]bool{}
				_ = kvplan.Runs(subs[i].Plan, 0, subs[i].Plan.Bytes(), func(off, _, n int64) {
					for b := off; b < off+n; b++ {
						seen[b] = true
					}
				})

				hit := false
				_ = kvplan.Runs(subs[j].Plan, 0, subs[j].Plan.Bytes(), func(off, _, n int64) {
					for b := off; b < off+n && !hit; b++ {
						hit = seen[b]
					}
				})

				if hit {
					return i, j, true
				}
			}
		}
		return 0, 0, false
	}
	dims := layout.Dims{NumLayers: 3, KVFactor: 2, NumHeads: 4, HeadDim: 2, ElemSize: 2, TokensPerBlock: 2, NumBlocks: 6}
	found := 0
	for _, o := range []layout.Order{layout.BlockMajor, layout.LayerMajor, layout.LayerMajorNHD} {
		l := layout.Packed(dims, o)
		for range 300 {
			subs := make([]SubSpec, 2+rng.IntN(2))
			for k := range subs {
				l0 := rng.Int64N(3)
				h0 := rng.Int64N(4)
				sel := layout.Selection{LayerBegin: l0, LayerEnd: l0 + 1 + rng.Int64N(3-l0), HeadBegin: h0, HeadEnd: h0 + 1 + rng.Int64N(4-h0)}
				ids := rng.Perm(6)[:1+rng.IntN(3)]
				blocks := make([]int32, len(ids))
				for x, id := range ids {
					blocks[x] = int32(id)
				}
				p, err := layout.NewPlan(l, sel, blocks)
				require.NoError(t, err)
				subs[k] = SubSpec{Peer: Peer(fmt.Sprint(k)), Plan: p}
			}
			wi, wj, wok := walk(subs)
			gi, gj, gok := overlappingSubs(subs)
			require.Equal(t, wok, gok, "%v", subs)
			if wok {
				found++
				require.Equal(t, [2]int{wi, wj}, [2]int{gi, gj})
			}
		}
	}
	require.NotZero(t, found, "some cases overlap")
}
