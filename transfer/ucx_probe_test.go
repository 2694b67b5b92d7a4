// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The receive probe (ucx_probe.go) makes Health tell when the worker receives nothing any
// more, with no transfer in flight to stall. A worker whose progress thread is held stands in
// for UCX's wedged shared-memory queue (which a peer killed mid-write leaves, at random): the
// probe's messages stop arriving, Health turns unhealthy naming ErrTransportWedged, and turns
// healthy again once they arrive. The probe's messages never reach the engine.
func TestL12_UCXProbeReportsAWedgedReceiveQueue(t *testing.T) {
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			u := newUCXEngine(t, tr.tls, tr.dev, Config{SlotBytes: 1 << 20, MaxConcurrent: 2})
			require.Eventually(t, func() bool { return u.tr.probe != nil && u.tr.probe.seen.Load() >= 2 }, 10*time.Second, 10*time.Millisecond,
				"the probe's messages arrive")
			require.True(t, u.e.Health().Healthy, u.e.Health().Reason)
			require.NoError(t, u.tr.TransportHealth())

			release := make(chan struct{})
			held := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				held <- u.tr.w.RunOnThread(ctx, func() {
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
			require.Eventually(t, func() bool { return errors.Is(u.tr.TransportHealth(), ErrTransportWedged) }, 10*time.Second, 10*time.Millisecond)
			h := u.e.Health()
			require.False(t, h.Healthy, "idle, yet nothing can arrive")
			require.Zero(t, h.InFlight)
			require.Contains(t, h.Reason, "wedged")
			require.Contains(t, h.Reason, "loopback probe")
			require.True(t, h.TransportWedged)

			close(release)
			require.NoError(t, <-held)
			require.Eventually(t, func() bool { return u.e.Health().Healthy }, 10*time.Second, 10*time.Millisecond,
				"the probe's messages arrive again: %s", u.e.Health().Reason)
			require.Zero(t, u.e.Health().MalformedControl, "probe messages are the transport's, never the engine's")
			require.False(t, u.e.Health().TransportWedged)
		})
	}
}

func TestUCXProbe_DisabledAndBadConfig(t *testing.T) {
	tr, err := NewUCXTransport(UCXConfig{TLS: "posix,cma,self", StagingBytes: 1 << 20, ProbeInterval: -1})
	require.NoError(t, err)
	e, err := New(tr, Config{SlotBytes: 1 << 20, MaxConcurrent: 1, StagingMemory: tr.StagingMemory()})
	require.NoError(t, err)
	defer func() { require.NoError(t, e.Close()) }()
	require.Nil(t, tr.probe, "ProbeInterval < 0: no probe")
	require.NoError(t, tr.TransportHealth())

	_, err = NewUCXTransport(UCXConfig{TLS: "posix,cma,self", StagingBytes: 1 << 20, ProbeInterval: time.Second, ProbeTimeout: time.Millisecond})
	var ce *ConfigError
	require.ErrorAs(t, err, &ce)
	require.True(t, strings.Contains(ce.Field, "ProbeTimeout"), ce.Field)
}
