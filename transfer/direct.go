// SPDX-License-Identifier: Apache-2.0

package transfer

// directRecvAhead is how many direct receives a transfer keeps posted (at least
// PipelineDepth): they hold no slot, only the caller's memory, which is reserved for the
// transfer anyway.
const directRecvAhead = 64

// directCapable reports whether this side may take the one-copy path: the engine allows it,
// the transport has it, the spec moves host memory through the plan (no Mover), and the
// transport can reach the pool in place.
func (x *xfer) directCapable() bool {
	if x.eng.cfg.DisableDirect || !x.hostPool || x.eng.direct == nil {
		return false
	}
	return x.eng.direct.Direct(x.pool)
}

// piecesTooSmall reports whether this side's pool holds the stream in pieces under
// Config.DirectMinRunBytes, which staging moves faster than the direct path's IOV entries.
func (x *xfer) piecesTooSmall() bool {
	return x.plan.RunUnits()*x.plan.Layout().RowBytes() < x.eng.cfg.DirectMinRunBytes
}

// iov lists the pool ranges holding stream bytes [off, off+n): what a direct operation hands
// the transport.
func (x *xfer) iov(off, n int64) ([][]byte, error) {
	var iov [][]byte
	err := x.plan.Runs(off, n, func(poolOff, _, length int64) {
		iov = append(iov, x.pool[poolOff:poolOff+length:poolOff+length])
	})
	return iov, err
}
