// SPDX-License-Identifier: Apache-2.0

package observe_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/observe"
)

// recorder notes every call it gets; full also implements the optional extensions.
type recorder struct{ calls []string }

func (r *recorder) OnTransition(id transfer.RequestID, sub int, from, to transfer.State, ev transfer.Event) {
	r.calls = append(r.calls, fmt.Sprintf("transition %d %d %v->%v %v", id, sub, from, to, ev))
}
func (r *recorder) OnCancel(id transfer.RequestID, o transfer.CancelOutcome) {
	r.calls = append(r.calls, fmt.Sprintf("cancel %d %v", id, o))
}
func (r *recorder) OnQuarantine(id transfer.RequestID, sub int, err error) {
	r.calls = append(r.calls, fmt.Sprintf("quarantine %d %d %v", id, sub, err))
}
func (r *recorder) OnPoison(id transfer.RequestID, slot int, reason string) {
	r.calls = append(r.calls, fmt.Sprintf("poison %d %d %s", id, slot, reason))
}
func (r *recorder) OnProgress(id transfer.RequestID, n int64, _ time.Time) {
	r.calls = append(r.calls, fmt.Sprintf("progress %d %d", id, n))
}

type full struct{ recorder }

func (f *full) OnStart(info transfer.StartInfo) {
	f.calls = append(f.calls, fmt.Sprintf("start %d receive=%v %v %d", info.ID, info.Receive, info.Peers, info.Bytes))
}
func (f *full) OnPeerConnected(p transfer.Peer) { f.calls = append(f.calls, "connected "+string(p)) }
func (f *full) OnPeerLost(p transfer.Peer, err error) {
	f.calls = append(f.calls, fmt.Sprintf("lost %s %v", p, err))
}

func TestMulti_FansOutInOrder(t *testing.T) {
	a, b := &full{}, &recorder{}
	obs := observe.Multi(a, nil, b)
	obs.OnTransition(1, -1, transfer.Queued, transfer.Advertised, anEvent)
	obs.OnCancel(1, transfer.CancelRequestedInFlight)
	obs.OnQuarantine(1, 0, errors.New("late"))
	obs.OnPoison(1, 3, "unknown")
	obs.OnProgress(1, 64, time.Now())
	obs.(observe.StartObserver).OnStart(transfer.StartInfo{ID: 2, Receive: true, Peers: []transfer.Peer{"p"}, Bytes: 8})
	obs.(observe.PeerObserver).OnPeerConnected("p")
	obs.(observe.PeerObserver).OnPeerLost("p", errors.New("gone"))

	base := []string{"transition 1 -1 queued->advertised " + anEvent.String(), "cancel 1 cancel-requested-in-flight",
		"quarantine 1 0 late", "poison 1 3 unknown", "progress 1 64"}
	require.Equal(t, append(append([]string{}, base...), "start 2 receive=true [p] 8", "connected p", "lost p gone"), a.calls)
	require.Equal(t, base, b.calls, "an observer without the extensions hears only the base events")
}

func TestMulti_Empty(t *testing.T) {
	obs := observe.Multi()
	obs.OnCancel(1, transfer.NotFound) // nothing to call, nothing to panic
	obs.(observe.StartObserver).OnStart(transfer.StartInfo{})
}
