// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/stale"
)

// Params of this transport's life pass; params of another life (a restarted sender, or one
// that replaced its worker) or of another worker fail at once with ErrStaleIncarnation.
func TestUCXTransport_CheckParamsIncarnation(t *testing.T) {
	tr, err := newTransport(Config{TLS: "posix,cma,self", StagingBytes: 64 << 10})
	require.NoError(t, err)
	defer tr.Close(true)
	l := layout.Packed(layout.Dims{NumLayers: 1, KVFactor: 2, NumHeads: 1, HeadDim: 8, ElemSize: 2, TokensPerBlock: 4, NumBlocks: 2}, layout.BlockMajor)
	plan, err := layout.NewPlan(l, l.All(), []int32{1})
	require.NoError(t, err)
	cp := tr.ContextParams(9, plan)
	require.Equal(t, tr.Incarnation(), cp.Incarnation)
	require.NoError(t, tr.CheckParams(cp))

	old := *cp
	old.Incarnation++
	err = tr.CheckParams(&old)
	require.ErrorIs(t, err, ErrStaleIncarnation)
	var se *stale.Error
	require.ErrorAs(t, err, &se)
	require.Equal(t, cp.Incarnation+1, se.Have)
	require.Equal(t, cp.Incarnation, se.Current)

	other := *cp
	other.WorkerAddress = append([]byte("x"), cp.WorkerAddress...)
	require.ErrorIs(t, tr.CheckParams(&other), ErrStaleIncarnation)
}
