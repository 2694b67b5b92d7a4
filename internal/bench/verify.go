// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"encoding/binary"
	"hash"
	"hash/crc32"
	"runtime"
	"sync"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
)

// castagnoli is CRC-32C: hardware-accelerated on amd64 and arm64, so checking every byte costs
// a fraction of moving it.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func newChecksum() hash.Hash32 { return crc32.New(castagnoli) }

// streamChecksum is the CRC-32C of the plan's stream as it lies in pool. It walks the pool
// with Go's plan math (kvplan.UnitOffset and RunUnits), not with the C gather, so a bug in the
// gather or scatter shows up as a mismatch instead of being checked against itself.
func streamChecksum(p *layout.Plan, pool []byte) uint32 {
	h := newChecksum()
	run := kvplan.RunUnits(p)
	runBytes := run * p.Layout().RowBytes()
	for u := int64(0); u < kvplan.Units(p); u += run {
		off := kvplan.UnitOffset(p, u)
		h.Write(pool[off : off+runBytes])
	}
	return h.Sum32()
}

// fillPattern writes a pattern in which every 8-byte word differs from every other word of
// the buffer (word i holds (seed+i) times an odd constant, a bijection), so a copy from or to
// a wrong offset changes the checksum. Large buffers are filled on every core.
func fillPattern(b []byte, seed uint64) { fillPatternShare(b, seed, 64<<20) }

// fillPatternShare is fillPattern with each core filling at least share bytes.
func fillPatternShare(b []byte, seed uint64, share int) {
	workers := min(runtime.GOMAXPROCS(0), (len(b)+share-1)/share)
	if workers <= 1 {
		fillPatternRange(b, 0, seed)
		return
	}
	per := (len(b)/workers + 7) &^ 7
	var wg sync.WaitGroup
	for w := range workers {
		lo := min(w*per, len(b))
		hi := min(lo+per, len(b))
		wg.Add(1)
		go func() {
			defer wg.Done()
			fillPatternRange(b[lo:hi], uint64(lo/8), seed)
		}()
	}
	wg.Wait()
}

func fillPatternRange(b []byte, firstWord, seed uint64) {
	const odd = 0x9E3779B97F4A7C15
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], (seed+firstWord+uint64(i/8))*odd)
	}
	var tail [8]byte
	binary.LittleEndian.PutUint64(tail[:], (seed+firstWord+uint64(i/8))*odd)
	copy(b[i:], tail[:])
}
