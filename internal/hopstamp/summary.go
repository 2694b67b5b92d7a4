// SPDX-License-Identifier: Apache-2.0

package hopstamp

import (
	"fmt"
	"slices"
	"sort"
)

// Hop is one row of a summary: a hop and the time from the hop before it (in the order the
// requests pass them at the median) to it, over the requests that passed both.
type Hop struct {
	Name         string
	Requests     int
	P50us, P90us float64 // from the previous hop
	AtP50us      float64 // from the request's first stamp, at the median
	OfAll        bool    // the total row
}

// Summarize orders the hops of the requests in ids by when the median request passes them,
// and gives each the median and 90th percentile of its time from the hop before it. A hop
// passed twice by one request counts as a second hop named with "#2" (a third and later pass
// as "#3", ...). The last row, "total", is the first stamp to the last.
func Summarize(stamps []Stamp, ids map[uint64]bool) []Hop {
	byReq := map[uint64][]Stamp{}
	for _, s := range stamps {
		if ids[s.ID] {
			byReq[s.ID] = append(byReq[s.ID], s)
		}
	}
	if len(byReq) == 0 {
		return nil
	}
	type pass struct {
		name string
		at   int64 // from the request's first stamp
	}
	reqs := make([][]pass, 0, len(byReq))
	offsets := map[string][]float64{}
	var totals []float64
	for _, ss := range byReq {
		sort.SliceStable(ss, func(i, j int) bool { return ss[i].Unix < ss[j].Unix })
		seen := map[string]int{}
		ps := make([]pass, 0, len(ss))
		for _, s := range ss {
			seen[s.Hop]++
			name := s.Hop
			if n := seen[s.Hop]; n > 1 {
				name = fmt.Sprintf("%s #%d", s.Hop, n)
			}
			p := pass{name, s.Unix - ss[0].Unix}
			ps = append(ps, p)
			offsets[name] = append(offsets[name], float64(p.at))
		}
		reqs = append(reqs, ps)
		totals = append(totals, float64(ss[len(ss)-1].Unix-ss[0].Unix))
	}
	names := make([]string, 0, len(offsets))
	at := map[string]float64{}
	for n, o := range offsets {
		names = append(names, n)
		at[n] = percentile(o, 50)
	}
	sort.SliceStable(names, func(i, j int) bool {
		if at[names[i]] != at[names[j]] {
			return at[names[i]] < at[names[j]]
		}
		return names[i] < names[j]
	})
	rank := map[string]int{}
	for i, n := range names {
		rank[n] = i
	}
	gaps := map[string][]float64{}
	for _, ps := range reqs {
		slices.SortStableFunc(ps, func(a, b pass) int { return rank[a.name] - rank[b.name] })
		for i := 1; i < len(ps); i++ {
			gaps[ps[i].name] = append(gaps[ps[i].name], float64(ps[i].at-ps[i-1].at))
		}
	}
	out := make([]Hop, 0, len(names)+1)
	for _, n := range names {
		g := gaps[n]
		out = append(out, Hop{Name: n, Requests: len(offsets[n]), P50us: percentile(g, 50) / 1e3,
			P90us: percentile(g, 90) / 1e3, AtP50us: at[n] / 1e3})
	}
	out = append(out, Hop{Name: "total", Requests: len(totals), P50us: percentile(totals, 50) / 1e3,
		P90us: percentile(totals, 90) / 1e3, AtP50us: percentile(totals, 50) / 1e3, OfAll: true})
	return out
}

// percentile is the nearest-rank percentile of v (0 for none); it sorts v.
func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	i := int(p/100*float64(len(v))+0.5) - 1
	return v[min(max(i, 0), len(v)-1)]
}
