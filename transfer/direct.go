// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"cmp"
	"slices"

	"github.com/kvxfer/kvxfer/internal/kvplan"
)

// directRecvAhead is how many direct receives a transfer keeps posted (at least
// PipelineDepth): they hold no slot, only the caller's memory, which is reserved for the
// transfer anyway.
const directRecvAhead = 64

// directCapable reports whether this side may take the one-copy path: the engine allows it,
// the transport has it, the spec moves host memory through the plan (no Mover), and the
// transport can reach the pool in place.
func (x *xfer) directCapable() bool {
	if x.eng.cfg.Tuning.DisableDirect || !x.hostPool || x.eng.direct == nil {
		return false
	}
	return x.eng.direct.Direct(x.pool)
}

// piecesTooSmall reports whether this side's pool holds the stream in pieces under
// Config.Tuning.DirectMinRunBytes, which staging moves faster than the direct path's IOV entries.
func (x *xfer) piecesTooSmall() bool {
	return kvplan.RunUnits(x.plan)*x.plan.Layout().RowBytes() < x.eng.cfg.Tuning.DirectMinRunBytes
}

// pullBeatsDirect (a receiver choosing its path) reports whether the staging path's pull
// wire, reading the sender's slots in place, would move this pool faster than the direct path.
// Where the pool's own contiguous ranges average under RMAMinRegionBytes, no RMA offer can be
// taken whatever the sender's layout (its gets are pieces of these ranges), so the direct path
// would send IOV messages; measured on UCX 1.13 shared memory, those moved TP=2->1 (16 KiB
// ranges) at half the in-place pull wire's rate and block-major -> layer-major (32 KiB) at
// 0.8 of it (docs/benchmarks.md, "The pull wire"). Where an RMA offer would be read in place
// (rmaInPlaceLikely) the direct path's RMA mode takes such ranges itself (InPlaceMinRegionBytes),
// one copy where the pull wire makes two, and this does not apply. Config.Tuning.DisableInPlaceReads
// (or DisablePull) keeps such pools on the direct path.
func (x *xfer) pullBeatsDirect() bool {
	if !x.pullWanted() || x.pullMapper() == nil || x.rmaInPlaceLikely() {
		return false // an RMA offer read in place takes small ranges too, in one copy
	}
	limit := x.eng.cfg.Tuning.RMAMinRegionBytes
	pieces := x.plan.Bytes() / (kvplan.RunUnits(x.plan) * x.plan.Layout().RowBytes())
	if pieces > rmaMaxPieces {
		return true // pieces too many to walk: small ones
	}
	// The ranges as an RMA offer's would merge: by pool offset, not stream order (a
	// block-major pool streams layer by layer, yet each of its blocks is one range).
	type span struct{ at, n int64 }
	var spans []span
	_ = kvplan.Runs(x.plan, 0, x.plan.Bytes(), func(at, _, n int64) { spans = append(spans, span{at, n}) })
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.at, b.at) })
	runs := int64(0)
	for i, sp := range spans {
		if i == 0 || spans[i-1].at+spans[i-1].n != sp.at {
			runs++
		}
	}
	return runs > 0 && x.plan.Bytes()/runs < limit
}

// iov lists the pool ranges holding stream bytes [off, off+n): what a direct operation hands
// the transport.
func (x *xfer) iov(off, n int64) ([][]byte, error) {
	var iov [][]byte
	err := kvplan.Runs(x.plan, off, n, func(poolOff, _, length int64) {
		iov = append(iov, x.pool[poolOff:poolOff+length:poolOff+length])
	})

	return iov, err
}
