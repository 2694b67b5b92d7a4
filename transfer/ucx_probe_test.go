// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/transfer/internal/ucxhooks"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
	"github.com/stretchr/testify/require"
)

// The receive probe (package ucx's probe.go) makes Health tell when the worker receives nothing any
// more, with no transfer in flight to stall. A worker whose progress thread is held stands in
// for UCX's wedged shared-memory queue (which a peer killed mid-write leaves, at random): the
// probe's messages stop arriving, Health turns unhealthy naming errTransportWedged, and turns
// healthy again once they arrive. The probe's messages never reach the engine.
func TestL12_UCXProbeReportsAWedgedReceiveQueue(t *testing.T) {
	// Each transport has its own engine, and waits for its probe's timeout: both at once.
	rows := newRowGroup(t, len(ucxTransports))
	defer rows.wait()
	for _, tr := range ucxTransports {
		rows.run(tr.name, func(t *testing.T) {
			u := newUCXEngine(t, tr.tls, tr.dev, Config{SlotBytes: 1 << 20, MaxConcurrent: 2})
			require.Eventually(t, func() bool { on, seen := ucxhooks.Hooks.ProbeSeen(u.tr); return on && seen >= 2 }, 10*time.Second, 10*time.Millisecond,
				"the probe's messages arrive")
			require.True(t, u.e.Health().Healthy, u.e.Health().Reason)
			require.NoError(t, ucxOf(u.tr).TransportHealth())

			release := make(chan struct{})
			held := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				held <- ucxhooks.Hooks.Worker(u.tr).RunOnThread(ctx, func() {
					select { // holds the worker's only thread: nothing is received meanwhile
					case <-release:
					case <-time.After(20 * time.Second):
					}
				})
			}()
			t.Cleanup(func() {
				select {
				case <-release:
				default:
					close(release)
				}
			})
			require.Eventually(t, func() bool { return errors.Is(ucxOf(u.tr).TransportHealth(), errTransportWedged) }, 10*time.Second, 10*time.Millisecond)
			h := u.e.Health()
			require.False(t, h.Healthy, "idle, yet nothing can arrive")
			require.Zero(t, h.Numbers.InFlight)
			require.Contains(t, h.Reason, "wedged")
			require.Contains(t, h.Reason, "loopback probe")
			require.True(t, h.Numbers.TransportWedged)

			close(release)
			require.NoError(t, <-held)
			require.Eventually(t, func() bool { return u.e.Health().Healthy }, 10*time.Second, 10*time.Millisecond,
				"the probe's messages arrive again: %s", u.e.Health().Reason)
			require.Zero(t, u.e.Health().Numbers.MalformedControl, "probe messages are the transport's, never the engine's")
			require.False(t, u.e.Health().Numbers.TransportWedged)
		})
	}
}

func TestUCXProbe_DisabledAndBadConfig(t *testing.T) {
	tr, err := ucx.New(ucx.Config{TLS: "posix,cma,self", StagingBytes: 1 << 20, ProbeInterval: -1})
	require.NoError(t, err)
	e, err := New(tr, Config{SlotBytes: 1 << 20, MaxConcurrent: 1, StagingMemory: tr.StagingMemory()})
	require.NoError(t, err)
	defer func() { require.NoError(t, e.Close()) }()
	on, _ := ucxhooks.Hooks.ProbeSeen(tr)
	require.False(t, on, "ProbeInterval < 0: no probe")
	require.NoError(t, ucxOf(tr).TransportHealth())

	_, err = ucx.New(ucx.Config{TLS: "posix,cma,self", StagingBytes: 1 << 20, ProbeInterval: time.Second, ProbeTimeout: time.Millisecond})
	var ce *ConfigError
	require.ErrorAs(t, err, &ce)
	require.True(t, strings.Contains(ce.Field, "ProbeTimeout"), ce.Field)

	// The device transport makes its CUDA context current on the worker's thread once: it
	// cannot swap workers, and says so before it touches a GPU.
	_, err = ucx.NewDevice(ucx.DeviceConfig{UCX: ucx.Config{ReplaceWedgedWorker: true}})
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "ucx.DeviceConfig.UCX.ReplaceWedgedWorker", ce.Field)
}

// With ucx.Config.ReplaceWedgedWorker, a worker the probe finds wedged is replaced: the
// transport gets a new address, a receive that was in flight on the old worker fails (never
// wedges) with no slot held, health is back without a restart, and a sender given the new
// address moves every byte. The wedge is stood in for by holding the worker's thread.
func TestL12_UCXReplacesAWedgedWorker(t *testing.T) {
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			cfg := ucxPeerTestConfig()
			cfg.TransferTimeout = 60 * time.Second // the failure must come from the replacement, not the deadline
			cfg.Tuning.DisablePull = true          // receives posted in the worker, not gets waiting for announcements
			recv := newUCXEngine(t, tr.tls, tr.dev, cfg, func(c *ucx.Config) {
				c.ProbeTimeout, c.ReplaceWedgedWorker = time.Second, true
			})
			send := newUCXEngine(t, tr.tls, tr.dev, cfg)
			require.Eventually(t, func() bool { on, seen := ucxhooks.Hooks.ProbeSeen(recv.tr); return on && seen >= 1 }, 10*time.Second, 10*time.Millisecond)
			before := recv.tr.Self()

			// A receive whose sender never sends: its receives sit in the old worker.
			stuckPool, stuckPlan := ucxEnginePool(t, 4, 5, false)
			stuck, err := recv.e.Receive(bg, Spec{ID: 90, Peer: send.tr.Self(), Plan: stuckPlan, Pool: stuckPool})
			require.NoError(t, err)
			// Its receives posted and its request sent on the worker about to wedge: held any
			// sooner, the worker would only wedge its endpoint's connect, and the receive, made
			// on the replacement once that returned, would rightly wait for its sender.
			require.Eventually(t, func() bool { return stuck.Status().State == Advertised }, 10*time.Second, time.Millisecond)
			// Every receive of its pipeline too: a post still under way when the worker wedges
			// lands on the replacement once the old worker lets go, and waits for its sender.
			depth := min(recv.e.cfg.Tuning.PipelineDepth, 4)
			require.Eventually(t, func() bool {
				return ucxhooks.Hooks.Ops(recv.tr) == depth
			}, 10*time.Second, time.Millisecond, "the stuck receive's %d receives posted", depth)

			release := make(chan struct{})
			held := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				held <- ucxhooks.Hooks.Worker(recv.tr).RunOnThread(ctx, func() {
					select {
					case <-release:
					case <-time.After(20 * time.Second):
					}
				})
			}()
			require.Eventually(t, func() bool { return ucxOf(recv.tr).WorkersReplaced() == 1 }, 15*time.Second, 10*time.Millisecond)
			require.NotEqual(t, before, recv.tr.Self(), "a new worker, a new address")
			close(release) // lets the old worker close
			require.NoError(t, <-held)

			waitClosed(t, stuck.Done(), "the receive in flight on the replaced worker ends")
			require.NotEqual(t, Completed, stuck.Status().State)
			require.Error(t, stuck.Status().Err)
			waitQuiesced(t, stuck, 10*time.Second)
			require.Eventually(t, func() bool { return recv.e.Health().Healthy }, 10*time.Second, 10*time.Millisecond,
				"healthy again without a restart: %s", recv.e.Health().Reason)
			require.Zero(t, recv.e.pool.Stats().Leased)

			// The sender learns the new address, as it would after a restart.
			src, plan := ucxEnginePool(t, 4, 7, true)
			dst, _ := ucxEnginePool(t, 4, 7, false)
			hs, err := send.e.Send(bg, Spec{ID: 91, Peer: recv.tr.Self(), Plan: plan, Pool: src, Timeout: 20 * time.Second})
			require.NoError(t, err)
			hr, err := recv.e.Receive(bg, Spec{ID: 91, Peer: send.tr.Self(), Plan: plan, Pool: dst, Timeout: 20 * time.Second})
			require.NoError(t, err)
			waitQuiesced(t, hr, 25*time.Second)
			waitQuiesced(t, hs, 25*time.Second)
			require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
			require.True(t, bytes.Equal(src, dst), "every byte, through the new worker")
			require.Equal(t, 1, ucxOf(recv.tr).WorkersReplaced())
		})
	}
}
