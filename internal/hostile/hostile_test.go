// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package hostile_test

import (
	"context"
	"crypto/rand"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/hostile"
	"github.com/kvxfer/kvxfer/internal/peerproc"
	"github.com/kvxfer/kvxfer/internal/peerproc/forgery"
)

// DurationEnv sets how long the whole run lasts (a Go duration), shared out between the
// transports; `make hostile` sets it to 10m. Unset: three rounds per transport, seconds.
const DurationEnv = "KVX_HOSTILE_DURATION"

// A lying peer over real UCX (shared memory with a cluster key the liar holds too, TCP on
// loopback without one) sends every forgery the transport allows: each is refused with a
// typed error and counted, no canary byte around the victim's pool, at the peer's pool
// address in this process or in a third process changes, and nothing of the peer's
// unregistered memory or of a canary reaches the pool.
func TestHostilePeer_EveryForgeryRefused(t *testing.T) {
	bin := peerproc.BuildHostilePeer(t)
	d, rounds := time.Duration(0), 3
	if s := os.Getenv(DurationEnv); s != "" {
		var err error
		d, err = time.ParseDuration(s)
		require.NoError(t, err, DurationEnv)
		d, rounds = d/2, 0 // two transports
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	for _, c := range []struct {
		desc, tls, devices string
		key                []byte
		want               []forgery.Forgery // sent at least once
	}{
		{"shm, cluster key", "posix,cma,self", "", key, []forgery.Forgery{forgery.Honest, forgery.OutsideRegistration,
			forgery.PastSegment, forgery.HugeLength, forgery.WrappingRange, forgery.OverlappingParts, forgery.GarbageKey,
			forgery.TruncatedKey, forgery.PidOfThird, forgery.PidOfVictim, forgery.ReplayedNonce, forgery.HelloForOther,
			forgery.UnsolicitedProof, forgery.UnsealedHello, forgery.ForeignKeyHello, forgery.UnsignedParams,
			forgery.ForeignParams, forgery.TamperedParams, forgery.ClaimWithoutProof, forgery.ClaimWrongProof}},
		{"tcp, no key", "tcp,self", "lo", nil, []forgery.Forgery{forgery.Honest, forgery.WrappingRange, forgery.OverlappingParts,
			forgery.GarbageKey, forgery.TruncatedKey, forgery.ReplayedNonce, forgery.HelloForOther, forgery.UnsolicitedProof}},
	} {
		t.Run(c.desc, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), d+3*time.Minute)
			defer cancel()
			rep, err := hostile.Run(ctx, hostile.Config{PeerBin: bin, TLS: c.tls, NetDevices: c.devices, ClusterKey: c.key,
				Duration: d, MaxRounds: rounds, Seed: 7, Logf: t.Logf})
			require.NoError(t, err, "%v", rep)
			t.Logf("%s: %s", c.desc, rep)
			require.True(t, rep.Clean(), "%s", rep)
			require.Zero(t, rep.CanaryChanged)
			require.Positive(t, rep.CanaryBytes)
			for _, f := range c.want {
				require.Positive(t, rep.Sent[f], "%s sent", f)
				require.Equal(t, rep.Sent[f], rep.Held[f], "%s: every one refused and counted", f)
			}
		})
	}
}
