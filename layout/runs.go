// SPDX-License-Identifier: Apache-2.0

package layout

// Runs walks stream bytes [off, off+n) of the plan as pool ranges, in stream order: fn gets
// each range's pool offset, its stream offset and its length. Ranges that lie back to back
// in the pool are merged, so a plan whose blocks are contiguous (a block-major pool moving
// whole blocks) yields few, long ranges. It is what a one-copy path hands the network as an
// IOV list instead of gathering into a staging buffer. It returns ErrOutOfRange (from
// CheckRange) for a range outside the stream and calls fn for nothing then.
func (p *Plan) Runs(off, n int64, fn func(poolOff, streamOff, length int64)) error {
	if err := p.CheckRange(off, n); err != nil {
		return err
	}
	row := p.layout.RowBytes()
	run := p.RunUnits()
	var curPool, curStream, curLen int64 // the range being merged; curLen 0: none yet
	for pos := int64(0); pos < n; {
		s := off + pos
		unit, in := s/row, s%row
		// Runs start at multiples of run in the stream (see kvx_run_units).
		left := (run - unit%run) * row
		k := min(left-in, n-pos)
		at := p.UnitOffset(unit) + in
		if curLen > 0 && curPool+curLen == at {
			curLen += k
		} else {
			if curLen > 0 {
				fn(curPool, curStream, curLen)
			}
			curPool, curStream, curLen = at, s, k
		}
		pos += k
	}
	if curLen > 0 {
		fn(curPool, curStream, curLen)
	}
	return nil
}
