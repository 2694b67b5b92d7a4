// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"

	"github.com/kvxfer/kvxfer/cuda/layout"
	"github.com/kvxfer/kvxfer/transfer"
)

// handoverVersion is bumped whenever handover changes shape, so a decode worker refuses a
// blob it would misread.
const handoverVersion = 1

// handover is what the prefill worker tells the decode worker about a prefilled request: the
// stand-in for kvxfer's ContextParams (transfer/contextparams.go, coming with the UCX
// transport), sent as JSON through the serving stack's own control plane.
type handover struct {
	Version int    `json:"version"`
	Request uint64 `json:"request"`
	// Peer is the prefill engine's transport address.
	Peer string `json:"peer"`
	// Pool is the prefill worker's KV pool; the decode worker checks its own matches.
	Pool layout.Dims `json:"pool"`
	// Tokens is the prompt length; Blocks the prefill-side blocks that hold its KV (the
	// receiver-driven protocol does not need them, a zero-copy mode will).
	Tokens int     `json:"tokens"`
	Blocks []int32 `json:"blocks"`
}

// check refuses a handover this decode worker cannot act on.
func (h handover) check(pool layout.Dims) error {
	switch {
	case h.Version != handoverVersion:
		return fmt.Errorf("handover version %d, want %d", h.Version, handoverVersion)
	case h.Pool != pool:
		return fmt.Errorf("prefill pool %+v differs from ours %+v: layouts incompatible", h.Pool, pool)
	case h.Peer == "" || h.Tokens <= 0 || len(h.Blocks) == 0:
		return fmt.Errorf("incomplete handover %+v", h)
	}
	return nil
}

func (h handover) id() transfer.RequestID { return transfer.RequestID(h.Request) }

// prefillRequest asks the prefill worker to prefill a prompt.
type prefillRequest struct {
	Request uint64 `json:"request"`
	Tokens  int    `json:"tokens"`
	// Decode is the transport address of the decode engine that will pull the KV: the
	// router picks both workers before prefill starts.
	Decode string `json:"decode"`
}

// abortRequest tells the prefill worker a request is gone (its client disconnected).
type abortRequest struct {
	Request uint64 `json:"request"`
}

// abortReply says what the prefill worker's engine did with the abort.
type abortReply struct {
	Outcome string `json:"outcome"`
}
