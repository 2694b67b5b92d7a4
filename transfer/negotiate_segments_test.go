// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"testing"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
	"github.com/stretchr/testify/require"
)

// largeSegments is an in-memory transport that says it sends pieces only a receiver built for
// them takes (as UCX's TCP transport with segments above 64 KiB does).
type largeSegments struct{ *mem.Transport }

func (largeSegments) SendsLargeSegments() bool { return true }

// TestLargeSegmentsGoOnlyToAReceiverThatTakesThem: a sender whose transport sends large pieces
// sends nothing to a receiver whose hello lacks wire.FeatureLargeSegments (an older build): the
// sender fails with an ErrPeerLacksFeature naming the feature (ErrPeerLacksFeature, ErrIncompatible),
// the receiver hears why, and not one byte reached its pool. A receiver of this build takes the
// transfer, and a sender that sends no large pieces serves the older receiver as before.
func TestLargeSegmentsGoOnlyToAReceiverThatTakesThem(t *testing.T) {
	for _, c := range []struct {
		name     string
		large    bool
		receiver speech
		refused  bool
	}{
		{"large pieces to an older receiver", true, lacking(wire.FeatureLargeSegments), true},
		{"large pieces to this build", true, buildSpeech(), false},
		{"usual pieces to an older receiver", false, lacking(wire.FeatureLargeSegments), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := mem.NewNetwork()
			prefill := n.Transport("prefill")
			var srcTr transport.Transport = prefill
			if c.large {
				srcTr = largeSegments{prefill}
			}
			a, err := newEngine(srcTr, patientConfig(), buildSpeech())
			require.NoError(t, err)
			b, err := newEngine(n.Transport("decode"), patientConfig(), c.receiver)
			require.NoError(t, err)
			t.Cleanup(func() {
				require.NoError(t, a.Close())
				require.NoError(t, b.Close())
				requireSlotsAccounted(t, a)
				requireSlotsAccounted(t, b)
			})
			src, dst := pools(t, 5)
			before := dst.stream(t)
			hs, err := a.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem})
			require.NoError(t, err)
			hr, err := b.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
			require.NoError(t, err)
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			if !c.refused {
				requireState(t, hs, Completed)
				requireState(t, hr, Completed)
				require.Equal(t, src.stream(t), dst.stream(t), "every byte")
				return
			}
			requireState(t, hs, Failed, ErrIncompatible, ErrPeerLacksFeature)
			var fe *featureError
			require.True(t, errors.As(hs.Status().Err, &fe))
			require.Equal(t, wire.FeatureLargeSegments, fe.Feature)
			requireState(t, hr, Failed, ErrPeerAborted)
			require.Contains(t, hr.Status().Err.Error(), "large-segments")
			require.Equal(t, before, dst.stream(t), "no byte reached the receiver")
		})
	}
}
