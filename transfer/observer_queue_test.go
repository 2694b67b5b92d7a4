// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/transfer/transport/mem"
	"github.com/stretchr/testify/require"
)

// blockingObserver blocks its first OnTransition until released, and records every
// transition it hears, by handle.
type blockingObserver struct {
	nopObserver
	entered, release chan struct{}
	once             sync.Once
	mu               sync.Mutex
	moves            map[RequestID][]State // the handle's (sub -1) states, from the first from
	starts           atomic.Int32
}

func (o *blockingObserver) OnTransition(id RequestID, sub int, from, to State, _ Event) {
	o.once.Do(func() {
		close(o.entered)
		<-o.release
	})
	if sub != -1 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.moves[id]) == 0 {
		o.moves[id] = append(o.moves[id], from)
	}
	o.moves[id] = append(o.moves[id], to)
}

func (o *blockingObserver) OnStart(StartInfo) { o.starts.Add(1) }

// TestCancelReturnsWhileTheObserverBlocks: a caller's Observer runs outside every lock that
// Cancel, Status and completions need: with the observer stuck inside a callback, Cancel,
// Status and a new Receive return, and once it is let go it hears every move of each handle
// in order, before that handle's Done closes (unless Cancel answered FreeNow: then Done was
// closed when it returned).
func TestCancelReturnsWhileTheObserverBlocks(t *testing.T) {
	obs := &blockingObserver{entered: make(chan struct{}), release: make(chan struct{}), moves: map[RequestID][]State{}}
	cfg := fastConfig()
	cfg.Observer = obs
	p := newPair(t, fastConfig(), cfg)
	_, dst := pools(t, 1)
	h, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
	require.NoError(t, err)
	<-obs.entered // the observer now sits inside its first OnTransition

	returned := make(chan CancelOutcome)
	go func() {
		_ = h.Status()
		other, err := p.dst.Receive(bg, Spec{ID: 2, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
		if err == nil {
			_ = p.dst.Cancel(2)
			defer func() { _ = other.Release() }()
		}
		returned <- p.dst.Cancel(1)
	}()
	var out CancelOutcome
	select {
	case out = <-returned:
	case <-time.After(10 * time.Second): // a bound on a wait for something that must happen
		close(obs.release)
		t.Fatal("Cancel, Status or Receive waited on the blocked observer")
	}
	require.Contains(t, []CancelOutcome{CancelledBeforeAdvertise, CancelRequestedInFlight}, out)
	close(obs.release)
	if out.FreeNow() {
		// Done closed as Cancel returned (TestL10_FreeNowCancelFindsDoneAndQuiescedClosed);
		// the observer hears the moves after.
		eventually(t, func() bool {
			obs.mu.Lock()
			defer obs.mu.Unlock()
			m := obs.moves[1]
			return len(m) > 0 && m[len(m)-1] == Cancelled
		}, "the observer heard the last move")
	}
	waitClosed(t, h.Done(), "cancelled")
	obs.mu.Lock()
	moves := append([]State(nil), obs.moves[1]...)
	obs.mu.Unlock()
	require.Equal(t, Cancelled, moves[len(moves)-1], "the observer heard the last move before Done closed: %v", moves)
	for i := 1; i < len(moves); i++ {
		require.NotEqual(t, moves[i-1], moves[i], "moves in order, each from the state before: %v", moves)
	}
	require.EqualValues(t, 2, obs.starts.Load())
	require.NoError(t, h.Release())
}

// slowObserver takes 300 ms over every OnTransition while slow is set.
type slowObserver struct {
	nopObserver
	slow atomic.Bool
}

func (o *slowObserver) OnTransition(RequestID, int, State, State, Event) {
	if o.slow.Load() {
		time.Sleep(300 * time.Millisecond)
	}
}

// BenchmarkCancelWithSlowObserver times Engine.Cancel of a receive waiting for its sender while
// the engine's Observer takes 300 ms over every transition: Cancel must not wait on it.
func BenchmarkCancelWithSlowObserver(b *testing.B) {
	obs := &slowObserver{}
	obs.slow.Store(true)
	cfg := fastConfig()
	cfg.Observer = obs
	cfg.MaxConcurrent, cfg.Tuning.PipelineDepth = 64, 1
	e, err := New(mem.NewNetwork().Transport("decode"), cfg)
	require.NoError(b, err)
	_, dst := pools(b, 1)
	hs := make([]*Handle, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		h, err := e.Receive(bg, Spec{ID: RequestID(i + 1), Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
		require.NoError(b, err)
		hs = append(hs, h)
		b.StartTimer()
		e.Cancel(RequestID(i + 1))
	}
	b.StopTimer()
	obs.slow.Store(false) // let the observer catch up, so Close does not wait on it
	for _, h := range hs {
		<-h.Quiesced()
		require.NoError(b, h.Release())
	}
	require.NoError(b, e.Close())
}
