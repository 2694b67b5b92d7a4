// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

func clusterKey(b byte) []byte { return bytes.Repeat([]byte{b}, ClusterKeyBytes) }

// TestClusterKeysAuthenticateTheHandshake: engines that share a cluster key (also in the middle
// of a rotation, each holding both keys in another order) meet and transfer, every byte. A
// receiver with keys refuses the handshake of a sender without one or of wire 3 (unsealed), and
// engines of two fleets refuse each other's (unknown-key), before answering: each message is
// counted by reason, the receiver never meets the sender, and its transfer ends at its queued
// deadline.
func TestClusterKeysAuthenticateTheHandshake(t *testing.T) {
	old, cur, other := clusterKey(1), clusterKey(2), clusterKey(3)
	for _, c := range []struct {
		desc         string
		sender       speech
		senderKeys   [][]byte
		receiverKeys [][]byte
		refused      string // the reason the receiver refuses the sender's messages; "" none
	}{
		{"one key on both", buildSpeech(), [][]byte{cur}, [][]byte{cur}, ""},
		{"a rotation: both keys, in either order", buildSpeech(), [][]byte{cur, old}, [][]byte{old, cur}, ""},
		{"a sender without keys", buildSpeech(), nil, [][]byte{cur}, "unsealed"},
		{"a sender of wire 3", wire3, nil, [][]byte{cur}, "unsealed"},
		{"another fleet's key", buildSpeech(), [][]byte{other}, [][]byte{cur}, "unknown-key"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			n := mem.NewNetwork()
			srcRefusals := &refusalCounter{}
			src := patientConfig()
			src.ClusterKeys, src.Observer = c.senderKeys, srcRefusals
			dstRefusals := &refusalCounter{}
			dst := patientConfig()
			dst.ClusterKeys, dst.Observer = c.receiverKeys, dstRefusals
			if c.refused != "" {
				src.QueueTimeout, dst.QueueTimeout = time.Second, time.Second
			}
			a, err := newEngine(n.Transport("prefill"), src, c.sender)
			require.NoError(t, err)
			b, err := newEngine(n.Transport("decode"), dst, buildSpeech())
			require.NoError(t, err)
			t.Cleanup(func() {
				require.NoError(t, a.Close())
				require.NoError(t, b.Close())
			})
			sp, dp := pools(t, 3)
			hs, err := a.Send(bg, Spec{ID: 1, Peer: "decode", Plan: sp.plan, Pool: sp.mem})
			require.NoError(t, err)
			hr, err := b.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dp.plan, Pool: dp.mem})
			require.NoError(t, err)
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			if c.refused == "" {
				requireState(t, hr, Completed)
				requireState(t, hs, Completed)
				require.Equal(t, sp.stream(t), dp.stream(t), "every byte")
				require.Zero(t, dstRefusals.auth())
				return
			}
			requireState(t, hr, Failed, ErrQueueTimeout)
			total, why := 0, 0
			for _, r := range []*refusalCounter{srcRefusals, dstRefusals} {
				total += r.auth()
				for _, what := range transport.AuthMessages {
					why += r.auth(what, c.refused)
				}
			}
			require.Positive(t, total, "handshake messages refused")
			require.Equal(t, total, why, "every one as %s", c.refused)
			require.Zero(t, believed(b, "prefill"), "the receiver never met the sender")
		})
	}
}

// TestClusterKeysRefuseForgedMessages: with cluster keys, a handshake message forged "from" a
// peer (sealed under the right key's id but not by the key, or a sealed one changed on the
// way) is refused as bad-mac before it is answered, counted, and changes nothing; the
// *AuthError names the message and the reason, and matches ErrUnauthenticated.
func TestClusterKeysRefuseForgedMessages(t *testing.T) {
	key := clusterKey(7)
	ring, err := wire.NewKeyring([][]byte{key})
	require.NoError(t, err)
	changed := func(m wire.Message) []byte {
		b := ring.SealMessage(m)
		b[len(b)-wire.SealBytes-1] ^= 1 // the last byte before the seal
		return b
	}
	forgedMAC := func(m wire.Message) []byte {
		b := ring.SealMessage(m)
		clear(b[len(b)-wire.MACBytes:])
		return b
	}
	for _, c := range []struct {
		desc string
		msg  []byte
		what string
	}{
		{"a hello changed on the way", changed(&wire.Hello{Min: wire.MinVersion, Max: wire.Version, Features: wire.FeatureLargeSegments}), "hello"},
		{"a hello with a made-up mac", forgedMAC(&wire.Hello{Min: 3, Max: 3, Features: wire.KnownFeatures}), "hello"},
		{"a challenge with a made-up mac", forgedMAC(&wire.HelloChallenge{}), "challenge"},
		{"a proof with a made-up mac", forgedMAC(&wire.HelloProof{Min: wire.MinVersion, Max: wire.Version, Features: wire.KnownFeatures}), "proof"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			cfg := patientConfig()
			cfg.ClusterKeys = [][]byte{key}
			tt := newTrustTrio(t, true, lacking(wire.FeatureLargeSegments), cfg)
			var sent int
			tt.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
				if fp.From == "prefill" {
					sent++ // under the network's lock
				}
				return mem.Fault{}
			})
			require.NoError(t, tt.net.Spoof("decode", "prefill", c.msg))
			eventually(t, func() bool { return tt.refusals.auth(c.what, "bad-mac") == 1 }, "the forged message refused")
			require.Zero(t, believed(tt.src, "decode"))
			tt.net.SetFault(nil) // a barrier: SetFault takes the network's lock
			require.Zero(t, sent, "nothing answered the forgery")
			ae := &AuthError{Peer: "decode", What: c.what, Reason: transport.AuthBadMAC}
			require.True(t, errors.Is(ae, ErrUnauthenticated))
			require.Contains(t, ae.Error(), c.what)
		})
	}
}
