// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// RequestIDs never hands out an id that is live for another name: with the real hash over many
// names, and with a hash that collides on purpose, where the second name is refused until the
// first is released. The same name maps to the same id in every RequestIDs (every process).
func TestRequestIDs_NoCollisionAmongLiveIDs(t *testing.T) {
	cases := []struct {
		desc  string
		hash  func(string) uint64
		names int
	}{
		{desc: "the real hash, many names", hash: nil, names: 100_000},
		{desc: "a hash of eight values: most names collide", hash: func(s string) uint64 { return uint64(len(s)) % 8 }, names: 64},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			ids := &RequestIDs{hash: tc.hash}
			other := &RequestIDs{hash: tc.hash} // another process: same names, same ids
			owner := map[RequestID]string{}
			refused := 0
			for i := range tc.names {
				name := fmt.Sprintf("cmpl-%0*d", i%13+1, i) // varied lengths for the weak hash
				id, err := ids.Acquire(name)
				if err != nil {
					require.ErrorIs(t, err, ErrDuplicate)
					require.Contains(t, err.Error(), name)
					refused++
					continue
				}
				prev, taken := owner[id]
				require.False(t, taken, "id %d handed to %q while live for %q", id, name, prev)
				owner[id] = name
				id2, err := other.Acquire(name)
				require.NoError(t, err)
				require.Equal(t, id, id2, "the same name in another process")
			}
			if tc.hash == nil {
				require.Zero(t, refused, "64-bit ids of 100,000 names")
			} else {
				require.Len(t, owner, 8)
				// Released, a colliding id goes to whichever name asks next.
				for id, name := range owner {
					ids.Release(name)
					for j := range tc.names {
						if cand := fmt.Sprintf("other-%d", j); tc.hash(cand) == uint64(id) {
							got, err := ids.Acquire(cand)
							require.NoError(t, err)
							require.Equal(t, id, got)
							break
						}
					}
				}
			}
		})
	}
}

func TestRequestIDs_DuplicateWhileLiveThenReleased(t *testing.T) {
	var ids RequestIDs
	id, err := ids.Acquire("req-1")
	require.NoError(t, err)
	_, err = ids.Acquire("req-1")
	require.ErrorIs(t, err, ErrDuplicate, "a name still live")
	ids.Release("req-1")
	ids.Release("req-1") // twice, or never acquired: nothing
	ids.Release("never")
	again, err := ids.Acquire("req-1")
	require.NoError(t, err)
	require.Equal(t, id, again)
}

func TestRequestIDs_Concurrent(t *testing.T) {
	var ids RequestIDs
	var wg sync.WaitGroup
	got := make([][]RequestID, 4)
	for g := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				name := fmt.Sprintf("g%d-r%d", g, i)
				id, err := ids.Acquire(name)
				if err == nil {
					got[g] = append(got[g], id)
				}
				if i%2 == 0 {
					ids.Release(name)
				}
			}
		}()
	}
	wg.Wait()
	seen := map[RequestID]bool{}
	for _, l := range got {
		require.Len(t, l, 1000)
		for _, id := range l {
			require.False(t, seen[id])
			seen[id] = true
		}
	}
}
