// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/cuda/layout"
)

// Spec describes one side of a transfer.
type Spec struct {
	// ID is the request id both sides use.
	ID RequestID
	// Peer is the other engine, as the transport names it. Leave empty when Subs is set.
	Peer Peer
	// Plan names this side's blocks in this side's pool: the sender gathers it, the receiver
	// scatters into it. Leave nil when Subs is set.
	Plan *layout.Plan
	// Pool is the caller's KV pool in host memory. The engine reads (Send) or writes
	// (Receive) it only through the plans, and never frees it: the caller frees its blocks
	// when the handle's Quiesced channel closes (or at once after a Cancel outcome that says
	// so). Ignored when Mover is set.
	Pool []byte
	// Mover, if set, replaces the host mover over Pool (device memory, say).
	Mover Mover
	// Timeout is the transfer's deadline, counted from its first staging slot lease.
	// Default Config.TransferTimeout.
	Timeout time.Duration
	// Subs, for a Receive only, splits the request over several peers (heterogeneous TP or
	// PP: a TP=1 rank receiving from two TP=2 ranks names each with the plan of its share of
	// heads). The handle is terminal only when every sub-transfer is. Peers must differ.
	Subs []SubSpec
}

// SubSpec is one peer's share of a multi-peer Receive.
type SubSpec struct {
	Peer Peer
	Plan *layout.Plan
}

// resolve checks the spec and returns its sub-transfers, mover and timeout.
func (s Spec) resolve(receive bool, cfg Config) ([]SubSpec, Mover, time.Duration, error) {
	bad := func(field, reason string, err error) error {
		return &SpecError{ID: s.ID, Field: field, Reason: reason, Err: err}
	}
	subs := s.Subs
	switch {
	case len(subs) > 0 && !receive:
		return nil, nil, 0, bad("Subs", "only a Receive may span several peers", nil)
	case len(subs) > 0 && (s.Peer != "" || s.Plan != nil):
		return nil, nil, 0, bad("Subs", "set either Peer and Plan, or Subs", nil)
	case len(subs) == 0:
		subs = []SubSpec{{Peer: s.Peer, Plan: s.Plan}}
	}
	if len(subs) > 1<<16 {
		return nil, nil, 0, bad("Subs", fmt.Sprintf("%d sub-transfers, at most %d", len(subs), 1<<16), nil)
	}
	if s.Timeout < 0 {
		return nil, nil, 0, bad("Timeout", "must not be negative", nil)
	}
	timeout := s.Timeout
	if timeout == 0 {
		timeout = cfg.TransferTimeout
	}
	mover := s.Mover
	seen := make(map[Peer]int, len(subs))
	for i, sub := range subs {
		field := "Plan"
		if len(s.Subs) > 0 {
			field = fmt.Sprintf("Subs[%d]", i)
		}
		if sub.Peer == "" {
			return nil, nil, 0, bad(field+".Peer", "empty peer", nil)
		}
		if j, dup := seen[sub.Peer]; dup {
			return nil, nil, 0, bad(field+".Peer", fmt.Sprintf("peer %q already named by Subs[%d]", sub.Peer, j), nil)
		}
		seen[sub.Peer] = i
		if sub.Plan == nil {
			return nil, nil, 0, bad(field, "nil plan", nil)
		}
		if mover == nil {
			if span := sub.Plan.PoolSpan(); int64(len(s.Pool)) < span {
				return nil, nil, 0, bad("Pool", fmt.Sprintf("%d bytes, the plan's layout spans %d", len(s.Pool), span), layout.ErrBufferTooSmall)
			}
		}
	}
	if mover == nil {
		mover = HostMover(s.Pool)
	}
	return subs, mover, timeout, nil
}
