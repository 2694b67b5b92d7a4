// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"testing"

	"github.com/stretchr/testify/require"

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
			var se *SpecError
			require.ErrorAs(t, err, &se)
			require.Equal(t, c.field, se.Field)
			require.Equal(t, NotFound, p.dst.Cancel(id), "a refused receive leaves nothing registered")
			requireSlotsAccounted(t, p.dst)
		})
	}
}
