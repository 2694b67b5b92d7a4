// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/tuning"
)

// silentPeer issues requests one after another, from an engine of its own, to a peer that
// never answers: each fails at a deadline a quarter of the progress deadline, so between two
// of them nothing is in flight, and no byte ever moves. Health must call that a stall (L12):
// the check samples the engine for the progress deadline plus Grace and records how long it
// reported unhealthy (Report.SilentUnhealthySeconds; zero is a breach). progressDeadline is
// the engine's Config.ProgressDeadline (the soak's, unless a test makes the check fail).
func (s *soak) silentPeer(ctx context.Context, progressDeadline time.Duration) {
	cfg := s.cfg
	s.silentRan.Store(true)
	newEngine := func(name transfer.Peer) (*transfer.Engine, error) {
		return transfer.New(s.net.Transport(name), transfer.Config{
			SlotBytes:        cfg.SlotBytes,
			MaxConcurrent:    1,
			ProgressDeadline: progressDeadline,
			Logger:           cfg.EngineLogger.With(zap.String("engine", string(name))),
			Tuning:           tuning.Config{QuarantineTimeout: cfg.QuarantineTimeout},
		})
	}
	client, err := newEngine("silent-client")
	if err != nil {
		s.addBreach(fmt.Sprintf("silent-peer check: %v", err))
		return
	}
	defer func() { _ = client.Close() }()
	silent, err := newEngine("silent-peer") // keeps the requests it gets, never sends
	if err != nil {
		s.addBreach(fmt.Sprintf("silent-peer check: %v", err))
		return
	}
	defer func() { _ = silent.Close() }()
	l := kvLayout(kvHeads, 2)
	plan, err := layout.NewPlan(l, l.All(), []int32{1, 0})
	must(err)
	pool := make([]byte, l.SpanBytes())

	timeout := cfg.ProgressDeadline / 4
	end := time.Now().Add(cfg.ProgressDeadline + cfg.Grace)
	last := time.Now()
	for id := transfer.RequestID(1); time.Now().Before(end) && ctx.Err() == nil; id++ {
		h, err := client.Receive(ctx, transfer.Spec{ID: id, Peer: "silent-peer", Plan: plan, Pool: pool, Timeout: timeout})
		if err != nil {
			s.addBreach(fmt.Sprintf("silent-peer check: request %d refused: %v", id, err))
			return
		}
		for quiet := false; !quiet; {
			select {
			case <-h.Quiesced():
				quiet = true
			case <-time.After(5 * time.Millisecond):
			}
			now := time.Now()
			if !client.Health().Healthy {
				s.silentUnhealthy.Add(int64(now.Sub(last)))
			}
			last = now
		}
		if st := h.Status(); st.Bytes != 0 || st.State == transfer.Completed {
			s.addBreach(fmt.Sprintf("silent-peer check: request %d moved %d bytes from a peer that never sends (%v)", id, st.Bytes, st.State))
		}
		_ = h.Release()
	}
}
