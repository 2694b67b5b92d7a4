// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kvxfer/kvxfer/layout"
)

// TestL11_UCXClosingSenderEndsItsWaitingReceivers is TestL11_ClosingSenderEndsItsWaitingReceivers
// over UCX shared memory and TCP: a Send that took its receiver's request and waits, Queued,
// for one of MaxConcurrent or a staging slot when its engine closes tells the receiver
// (AbortClosed), which ends at once, cleanly, not at its deadline a minute away. (That its
// request never reached the Send is not made to happen over UCX; the in-memory test drops it.)
func TestL11_UCXClosingSenderEndsItsWaitingReceivers(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 8}
	for _, tr := range ucxTransports {
		for _, c := range queuedSenderCases {
			if c.waits == "request" {
				continue
			}
			t.Run(tr.name+"/"+c.name, func(t *testing.T) {
				cfg := ucxTestConfig()
				cfg.TransferTimeout, cfg.QueueTimeout = time.Minute, time.Minute // the close, not a deadline, ends them
				cfg.Tuning.DisableDirect, cfg.Tuning.DisableRMA = !c.direct, true
				cfg.Logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
				scfg := cfg
				c.sender(&scfg)
				survivor := newUCXEngine(t, tr.tls, tr.dev, cfg)
				leaving := newUCXEngine(t, tr.tls, tr.dev, scfg)
				kv := func(send bool, i int) ([]byte, *layout.Plan) {
					u, seed := survivor, uint64(0)
					if send {
						u, seed = leaving, uint64(i)
					}
					k := newUCXKV(t, dims, layout.BlockMajor, seqBlocks(0, 8), seed)
					if c.direct {
						k = mappedKV(t, u, dims, layout.BlockMajor, seqBlocks(0, 8), seed)
					}
					return k.mem, k.plan
				}
				queuedSenderCloses(t, c, leaving.e, survivor.e, survivor.tr.Self(), leaving.tr.Self(), kv, nil, true)
			})
		}
	}
}

// TestL11_UCXReceiverAbortEndsItsQueuedSend is TestL11_ReceiverAbortEndsItsQueuedSend over UCX
// shared memory and TCP.
func TestL11_UCXReceiverAbortEndsItsQueuedSend(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 8}
	for _, tr := range ucxTransports {
		for _, c := range queuedSenderCases {
			if c.waits == "request" {
				continue
			}
			t.Run(tr.name+"/"+c.name, func(t *testing.T) {
				cfg := ucxTestConfig()
				cfg.TransferTimeout, cfg.QueueTimeout = time.Minute, time.Minute // the abort, not a deadline, ends it
				cfg.Tuning.DisableDirect, cfg.Tuning.DisableRMA = !c.direct, true
				cfg.Logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
				scfg := cfg
				c.sender(&scfg)
				receiver := newUCXEngine(t, tr.tls, tr.dev, cfg)
				sender := newUCXEngine(t, tr.tls, tr.dev, scfg)
				kv := func(send bool, i int) ([]byte, *layout.Plan) {
					u, seed := receiver, uint64(0)
					if send {
						u, seed = sender, uint64(i)
					}
					k := newUCXKV(t, dims, layout.BlockMajor, seqBlocks(0, 8), seed)
					if c.direct {
						k = mappedKV(t, u, dims, layout.BlockMajor, seqBlocks(0, 8), seed)
					}
					return k.mem, k.plan
				}
				receiverAbortsQueuedSend(t, c, sender.e, receiver.e, receiver.tr.Self(), sender.tr.Self(), kv, nil)
			})
		}
	}
}
