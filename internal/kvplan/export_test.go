// SPDX-License-Identifier: Apache-2.0

package kvplan

import "github.com/kvxfer/kvxfer/layout"

// RunsByDivision is Runs as it was before the walk carried its digits: every piece's pool
// offset re-derived from its stream unit by division (unitOffset). Tests hold Runs to it.
func RunsByDivision(p *layout.Plan, off, n int64, fn func(poolOff, streamOff, length int64)) error {
	if err := CheckRange(p, off, n); err != nil {
		return err
	}
	l, s, blocks := p.Layout(), p.Selection(), p.Blocks()
	row := l.RowBytes()
	run := runUnits(l, s)
	var curPool, curStream, curLen int64
	for pos := int64(0); pos < n; {
		st := off + pos
		unit, in := st/row, st%row
		left := (run - unit%run) * row
		k := min(left-in, n-pos)
		at := unitOffset(l, s, blocks, unit) + in
		if curLen > 0 && curPool+curLen == at {
			curLen += k
		} else {
			if curLen > 0 {
				fn(curPool, curStream, curLen)
			}
			curPool, curStream, curLen = at, st, k
		}
		pos += k
	}
	if curLen > 0 {
		fn(curPool, curStream, curLen)
	}
	return nil
}
