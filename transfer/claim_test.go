// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// TestL10_ForgedClaimLeavesTheSendToTheRealReceiver: a Send that carries a per-request secret
// (with cluster keys, or Config.RequireClaimProof) takes a request only with a valid claim
// proof. A Receive with the wrong secret or none is refused: it fails with ErrUnauthenticated
// and the refusal is counted (what "claim"), while the Send keeps waiting, frees and poisons
// nothing, and completes with the real receiver, every byte. Without a secret on the Send, or
// without keys and RequireClaimProof, no proof is asked for.
func TestL10_ForgedClaimLeavesTheSendToTheRealReceiver(t *testing.T) {
	secret := bytes.Repeat([]byte{0x5c}, claimSecretBytes)
	wrong := bytes.Repeat([]byte{0x3a}, claimSecretBytes)
	key := clusterKey(4)
	for _, c := range []struct {
		desc       string
		keys       [][]byte
		require    bool
		first      []byte // the first Receive's secret
		refused    string // its refusal's reason; "" when it is not refused
		sendSecret bool
	}{
		{"cluster keys: the right secret", [][]byte{key}, false, secret, "", true},
		{"cluster keys: a wrong secret", [][]byte{key}, false, wrong, "bad-mac", true},
		{"cluster keys: no proof", [][]byte{key}, false, nil, "unsealed", true},
		{"RequireClaimProof: a wrong secret", nil, true, wrong, "bad-mac", true},
		{"RequireClaimProof: no proof", nil, true, nil, "unsealed", true},
		{"no keys, not required: no proof asked", nil, false, nil, "", true},
		{"a Send without a secret: no proof asked", [][]byte{key}, true, nil, "", false},
	} {
		t.Run(c.desc, func(t *testing.T) {
			n := mem.NewNetwork()
			src, dst := patientConfig(), patientConfig()
			src.ClusterKeys, dst.ClusterKeys = c.keys, c.keys
			src.RequireClaimProof = c.require
			// The receiver resends a request its sender has not answered after RetryInterval,
			// and the sender counts each refused copy: under a loaded host the refusal took
			// longer than fastConfig's 20ms, and two were counted. The mem wire loses nothing,
			// so no resend is needed here.
			dst.Tuning.RetryInterval = time.Minute
			refusals := &refusalCounter{}
			src.Observer = refusals
			a, err := New(n.Transport("prefill"), src)
			require.NoError(t, err)
			b, err := New(n.Transport("decode"), dst)
			require.NoError(t, err)
			t.Cleanup(func() {
				require.NoError(t, a.Close())
				require.NoError(t, b.Close())
			})
			sp, dp := pools(t, 3)
			send := Spec{ID: 1, Peer: "decode", Plan: sp.plan, Pool: sp.mem}
			if c.sendSecret {
				send.Secret = secret
			}
			hs, err := a.Send(bg, send)
			require.NoError(t, err)
			h1, err := b.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dp.plan, Pool: dp.mem, Secret: c.first})
			require.NoError(t, err)
			waitClosed(t, h1.Quiesced(), "the first receiver quiesced")
			if c.refused == "" {
				requireState(t, h1, Completed)
				waitClosed(t, hs.Quiesced(), "sender quiesced")
				requireState(t, hs, Completed)
				require.Equal(t, sp.stream(t), dp.stream(t), "every byte")
				require.Zero(t, refusals.auth())
				return
			}
			requireState(t, h1, Failed, ErrUnauthenticated)
			eventually(t, func() bool { return refusals.auth("claim", c.refused) == 1 }, "the claim refused and counted")
			select {
			case <-hs.Done():
				t.Fatalf("a refused claim ended the Send: %+v", hs.Status())
			default:
			}
			require.NoError(t, h1.Release()) // its id is free for the real receiver
			// The real receiver, with the blob's secret, still gets every byte.
			h2 := startOnceFree(t, func() (*Handle, error) {
				return b.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dp.plan, Pool: dp.mem, Secret: secret})
			})
			waitClosed(t, h2.Quiesced(), "the real receiver quiesced")
			requireState(t, h2, Completed)
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			requireState(t, hs, Completed)
			require.Equal(t, sp.stream(t), dp.stream(t), "every byte")
			require.Equal(t, 1, refusals.auth(), "one refusal")
		})
	}
}

// TestL10_ReplayedClaimProvesNothingForTheNextSend: a request recorded from a transfer that
// completed (its claim valid for that transfer's secret, nonce and receiver), replayed "from"
// the receiver to a new Send of the same request id, is refused (counted as bad-mac: the new
// Send has a new secret) and the new Send completes with the real receiver.
func TestL10_ReplayedClaimProvesNothingForTheNextSend(t *testing.T) {
	n := mem.NewNetwork()
	src, dst := patientConfig(), patientConfig()
	src.ClusterKeys, dst.ClusterKeys = [][]byte{clusterKey(5)}, [][]byte{clusterKey(5)}
	refusals := &refusalCounter{}
	src.Observer = refusals
	a, err := New(n.Transport("prefill"), src)
	require.NoError(t, err)
	b, err := New(n.Transport("decode"), dst)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, a.Close())
		require.NoError(t, b.Close())
	})
	sp, dp := pools(t, 3)
	run := func(secret []byte, before func()) *Handle {
		hs := startOnceFree(t, func() (*Handle, error) {
			return a.Send(bg, Spec{ID: 1, Peer: "decode", Plan: sp.plan, Pool: sp.mem, Secret: secret})
		})
		if before != nil {
			before()
		}
		hr := startOnceFree(t, func() (*Handle, error) {
			return b.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dp.plan, Pool: dp.mem, Secret: secret})
		})
		waitClosed(t, hr.Quiesced(), "receiver quiesced")
		waitClosed(t, hs.Quiesced(), "sender quiesced")
		requireState(t, hr, Completed)
		requireState(t, hs, Completed)
		require.NoError(t, hs.Release())
		require.NoError(t, hr.Release())
		return hr
	}
	first := NewClaimSecret()
	hr := run(first, nil)
	nonce := hr.subs[0].nonce
	recorded := &wire.RequestInfo{Header: wire.Header{Request: 1, Nonce: nonce}, Shape: kvplan.ShapeOf(dp.plan), ChunkBytes: 4096, Depth: 2,
		Flags: wire.FlagClaim, Claim: wire.Claim{Incarnation: b.incarnation, Proof: wire.ClaimProof(first, 1, 0, nonce, b.incarnation)}}
	run(NewClaimSecret(), func() {
		require.NoError(t, n.Spoof("decode", "prefill", wire.Encode(recorded)))
		eventually(t, func() bool { return refusals.auth("claim", "bad-mac") == 1 }, "the replayed claim refused")
	})
	require.Equal(t, sp.stream(t), dp.stream(t), "every byte")
	require.Equal(t, 1, refusals.auth(), "the replay, nothing else")
}

// A Spec's secret is claimSecretBytes or none; any other size is an ErrInvalidSpec naming Secret.
func TestSpecSecretIsValidated(t *testing.T) {
	e, err := New(mem.NewNetwork().Transport("prefill"), patientConfig())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	sp, _ := pools(t, 1)
	for _, c := range []struct {
		desc   string
		secret []byte
	}{
		{"short", make([]byte, claimSecretBytes-1)},
		{"long", make([]byte, claimSecretBytes+1)},
		{"empty, not nil", []byte{}},
	} {
		t.Run(c.desc, func(t *testing.T) {
			_, err := e.Send(bg, Spec{ID: 1, Peer: "decode", Plan: sp.plan, Pool: sp.mem, Secret: c.secret})
			var se *specError
			require.ErrorAs(t, err, &se)
			require.Equal(t, "Secret", se.Field)
		})
	}
}

// startOnceFree starts a transfer whose request id a released handle held: the engine lets the
// id go when that handle's goroutine has left, which may be just after Quiesced closed, so
// ErrDuplicate is retried for a bounded time.
func startOnceFree(t *testing.T, start func() (*Handle, error)) *Handle {
	t.Helper()
	var h *Handle
	eventually(t, func() bool {
		var err error
		h, err = start()
		if errors.Is(err, ErrDuplicate) {
			return false
		}
		require.NoError(t, err)
		return true
	}, "the request id free again")
	return h
}
