// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/native"
)

// The checksum walk agrees with the reference gather on random layouts, and disagrees when a
// single byte of the stream is wrong.
func TestStreamChecksumMatchesReferenceAndCatchesOneWrongByte(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 200 {
		p := layouttest.RandomPlan(r)
		pool := make([]byte, p.Layout().SpanBytes())
		fillPattern(pool, uint64(i))
		stream := make([]byte, p.Bytes())
		require.NoError(t, layouttest.ReferenceGather(p, pool, stream))
		h := newChecksum()
		h.Write(stream)
		require.Equal(t, h.Sum32(), streamChecksum(p, pool), "plan %d", i)

		stream[r.IntN(len(stream))] ^= 0x40
		h = newChecksum()
		h.Write(stream)
		require.NotEqual(t, h.Sum32(), streamChecksum(p, pool), "plan %d: a flipped byte must show", i)
	}
}

// The pattern makes every 8-byte word distinct, so a gather from a wrong offset (here, one
// word off) changes the checksum.
func TestPatternCatchesShiftedCopies(t *testing.T) {
	b := make([]byte, 1<<20+5)
	fillPattern(b, 9)
	seen := map[string]bool{}
	for i := 0; i+8 <= len(b); i += 8 {
		w := string(b[i : i+8])
		require.False(t, seen[w], "word %d repeats", i/8)
		seen[w] = true
	}
	c := newChecksum()
	c.Write(b[0:4096])
	d := newChecksum()
	d.Write(b[8:4104])
	require.NotEqual(t, c.Sum32(), d.Sum32())

	// The parallel fill writes the same bytes as a serial one.
	big := make([]byte, 8<<20+3)
	fillPatternShare(big, 5, 1<<20)
	serial := make([]byte, len(big))
	fillPatternRange(serial, 0, 5)
	require.Equal(t, serial, big)
}

// hostMeasure.verify fails when the scatter puts bytes where the plan does not say.
func TestHostVerifyFailsOnAWrongPlan(t *testing.T) {
	skipWithoutHostCopy(t)
	l := layouttest.Llama3_8B(6)
	p, err := layout.NewPlan(l, l.All(), []int32{4, 1})
	require.NoError(t, err)
	pool := make([]byte, l.SpanBytes())
	fillPattern(pool, 1)
	chunks, err := kvplan.Chunks(p, 1<<20)
	require.NoError(t, err)
	m := hostMeasure{plan: p, chunks: chunks, pool: pool, slot: make([]byte, 1<<20), op: "gather"}
	require.NoError(t, m.verify())
	m.op = "scatter"
	require.NoError(t, m.verify())

	// Gather with another block order than the plan that is checked: the checksum differs.
	other, err := layout.NewPlan(l, l.All(), []int32{1, 4})
	require.NoError(t, err)
	h := newChecksum()
	buf := make([]byte, other.Bytes())
	require.NoError(t, native.HostGather(other, pool, 0, buf))
	h.Write(buf)
	require.NotEqual(t, h.Sum32(), streamChecksum(p, pool))
}
