// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
)

// TestUCXOneHop32Tokens_Allocations: a 32-token one-hop request over UCX shared memory, both
// engines in this process (BenchmarkUCXOneHop32Tokens's request), allocates at most a budget.
// Every allocation is paid by a process at the request rate, and at 16 concurrent requests
// the two cores' time not spent copying is the row's limit. The count covers every goroutine
// (the workers', the transports', the timers'), so the budget has room for their variation:
// at f1e1b6b the request took 246, now 177-178 (191-193 with -race).
func TestUCXOneHop32Tokens_Allocations(t *testing.T) {
	cfg := ucxTestConfig()
	cfg.Tuning.DirectChunkBytes, cfg.Tuning.RMAMinRegionBytes = 64<<10, 1<<10
	src := newUCXEngine(t, "posix,cma,self", "", cfg)
	dst := newUCXEngine(t, "posix,cma,self", "", cfg)
	s := mappedKV(t, src, ucxExposeDims, layout.BlockMajor, seqBlocks(3, 2), 7)
	r := mappedKV(t, dst, ucxExposeDims, layout.BlockMajor, seqBlocks(30, 2), 0)
	id := RequestID(1000)
	one := func() { oneHopRequest(t, src, dst, s, r, id); id++ }
	for range 50 { // the endpoints, remote keys and pools' first uses
		one()
	}
	got := testing.AllocsPerRun(200, one)
	t.Logf("%.0f allocations a request", got)
	require.LessOrEqual(t, got, float64(oneHopAllocBudget+10*raceAllocs), "heap allocations a one-hop request")
}

// oneHopAllocBudget is what TestUCXOneHop32Tokens_Allocations allows a request.
const oneHopAllocBudget = 200
