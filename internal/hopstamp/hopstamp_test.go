// SPDX-License-Identifier: Apache-2.0

package hopstamp

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Off, a Mark records nothing; on, the stamps of the requests asked for are ordered as the
// median request passes them, each hop timed from the one before it, a second pass of a hop
// named "#2", and requests not asked for left out.
func TestSummarize(t *testing.T) {
	Mark(1, "before Start")
	MarkLast("before Start")
	require.Empty(t, Stop())

	us := int64(1000)
	stamps := []Stamp{
		// request 1: a at 100, b +5, a again +20
		{1, "a", 100 * us}, {1, "b", 105 * us}, {1, "a", 125 * us},
		// request 2 (out of order): a at 200, b +15, a again +10
		{2, "b", 215 * us}, {2, "a", 200 * us}, {2, "a", 225 * us},
		// request 3: not asked for
		{3, "a", 0}, {3, "b", 999 * us},
	}
	cases := []struct {
		desc string
		ids  map[uint64]bool
		want []Hop
	}{
		{"one request", map[uint64]bool{1: true}, []Hop{
			{Name: "a", Requests: 1},
			{Name: "b", Requests: 1, P50us: 5, P90us: 5, AtP50us: 5},
			{Name: "a #2", Requests: 1, P50us: 20, P90us: 20, AtP50us: 25},
			{Name: "total", Requests: 1, P50us: 25, P90us: 25, AtP50us: 25, OfAll: true},
		}},
		{"two requests (nearest rank: p50 the lower of two, p90 the higher)", map[uint64]bool{1: true, 2: true}, []Hop{
			{Name: "a", Requests: 2},
			{Name: "b", Requests: 2, P50us: 5, P90us: 15, AtP50us: 5},
			{Name: "a #2", Requests: 2, P50us: 10, P90us: 20, AtP50us: 25},
			{Name: "total", Requests: 2, P50us: 25, P90us: 25, AtP50us: 25, OfAll: true},
		}},
		{"none of them", map[uint64]bool{9: true}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			require.Equal(t, tc.want, Summarize(stamps, tc.ids))
		})
	}

	Start()
	Mark(7, "x")
	MarkLast("y")
	got := Stop()
	require.Len(t, got, 2)
	require.Equal(t, uint64(7), got[1].ID, "MarkLast goes to the request marked last")
	require.Equal(t, "y", got[1].Hop)

	// Past lastWindow, a stamp that does not know its request is dropped.
	Start()
	Mark(8, "x")
	time.Sleep(2 * lastWindow)
	MarkLast("late")
	require.Len(t, Stop(), 1)
}
