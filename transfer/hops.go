// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"

	"github.com/kvxfer/kvxfer/internal/hopstamp"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
)

// The hop stamps of kvxbench --hops (internal/hopstamp, docs/benchmarks.md): each helper is
// one atomic load unless a program turned the stamps on, and builds no name until then.

// stampSide marks that request id passed hop, prefixed by its side: recv for a Receive, send
// for a Send or an exposure.
func stampSide(id RequestID, receive bool, hop string) {
	if !hopstamp.On() {
		return
	}
	side := "send "
	if receive {
		side = "recv "
	}
	hopstamp.Mark(uint64(id), side+hop)
}

// stamp marks that this transfer passed hop.
func (x *xfer) stamp(hop string) { stampSide(x.h.id, x.receive, hop) }

// stampLoop marks that this transfer's loop took message m.
func (x *xfer) stampLoop(m wire.Message) {
	if hopstamp.On() {
		x.stamp(fmt.Sprintf("%T on loop", m))
	}
}

// stampIn marks that message m reached the engine from the transport.
func stampIn(m wire.Message) {
	if hopstamp.On() {
		hopstamp.Mark(uint64(m.Head().Request), fmt.Sprintf("%T in", m))
	}
}
