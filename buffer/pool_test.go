// SPDX-License-Identifier: Apache-2.0

package buffer

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNewValidatesConfig(t *testing.T) {
	cases := []struct {
		desc  string
		mem   int
		cfg   Config
		field string
		want  error
	}{
		{"zero slot size", 1024, Config{}, "SlotBytes", ErrInvalidConfig},
		{"slot larger than memory", 1024, Config{SlotBytes: 2048}, "SlotBytes", ErrInvalidConfig},
		{"negative concurrency", 1024, Config{SlotBytes: 256, Concurrency: -1}, "Concurrency", ErrInvalidConfig},
		{"negative lease timeout", 1024, Config{SlotBytes: 256, LeaseTimeout: -time.Second}, "LeaseTimeout", ErrInvalidConfig},
		{"fewer slots than concurrency", 1024, Config{SlotBytes: 256, Concurrency: 5}, "Concurrency", ErrUndersized},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			_, err := New(make([]byte, c.mem), c.cfg)
			require.ErrorIs(t, err, c.want)
			var ce *ConfigError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, c.field, ce.Field)
		})
	}
}

func TestL13_UndersizedPoolRefusedWithCount(t *testing.T) {
	_, err := New(make([]byte, 3*4096), Config{SlotBytes: 4096, Concurrency: 8})
	require.ErrorIs(t, err, ErrUndersized)
	require.Contains(t, err.Error(), "needs at least 8 slots")
	require.Contains(t, err.Error(), "holds 3")

	p, err := New(make([]byte, 8*4096+100), Config{SlotBytes: 4096, Concurrency: 8})
	require.NoError(t, err)
	require.Equal(t, Stats{Total: 8, Free: 8}, p.Stats())
}

func TestLeaseReleasePoison(t *testing.T) {
	mem := make([]byte, 4*64)
	p, err := New(mem, Config{SlotBytes: 64, Concurrency: 2})
	require.NoError(t, err)

	a, err := p.TryLease()
	require.NoError(t, err)
	require.Len(t, a.Bytes(), 64)
	require.Equal(t, 64, cap(a.Bytes()), "a slot must not reach into its neighbour")
	b, err := p.Lease(context.Background())
	require.NoError(t, err)
	require.NotEqual(t, a.Index(), b.Index())
	require.Equal(t, Stats{Total: 4, Free: 2, Leased: 2}, p.Stats())

	require.NoError(t, a.Release())
	require.ErrorIs(t, a.Release(), ErrNotLeased, "double release")
	require.ErrorIs(t, a.Poison("late"), ErrNotLeased, "poison after release")
	require.NoError(t, b.Poison("transport lost it"))
	require.ErrorIs(t, b.Release(), ErrNotLeased, "release after poison")
	require.Equal(t, Stats{Total: 4, Free: 3, Poisoned: 1}, p.Stats())
	rec := p.Poisoned()
	require.Len(t, rec, 1)
	require.Equal(t, b.Index(), rec[0].Slot)
	require.Equal(t, "transport lost it", rec[0].Reason)

	// The poisoned slot is never handed out again.
	for range 3 {
		s, err := p.TryLease()
		require.NoError(t, err)
		require.NotEqual(t, b.Index(), s.Index())
	}
	_, err = p.TryLease()
	require.ErrorIs(t, err, ErrNoSlot)
}

func TestL11_LeaseWaitIsBounded(t *testing.T) {
	p, err := New(make([]byte, 64), Config{SlotBytes: 64, LeaseTimeout: 30 * time.Millisecond})
	require.NoError(t, err)
	s, err := p.TryLease()
	require.NoError(t, err)

	start := time.Now()
	_, err = p.Lease(context.Background()) // no deadline: the pool's LeaseTimeout bounds it
	require.ErrorIs(t, err, ErrNoSlot)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 2*time.Second)

	// A cancel ends the wait too: on a pool whose own bound is far away, so a loaded host
	// cannot let the LeaseTimeout win the race (seen in a CI run).
	patient, err := New(make([]byte, 64), Config{SlotBytes: 64, LeaseTimeout: time.Minute})
	require.NoError(t, err)
	_, err = patient.TryLease()
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(10 * time.Millisecond); cancel() }()
	_, err = patient.Lease(ctx)
	require.ErrorIs(t, err, context.Canceled)

	// A waiter gets the slot as soon as it is released.
	go func() { time.Sleep(10 * time.Millisecond); _ = s.Release() }()
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s2, err := p.Lease(ctx)
	require.NoError(t, err)
	require.NoError(t, s2.Release())

	p.Close()
	_, err = p.Lease(ctx)
	require.ErrorIs(t, err, ErrClosed)
	_, err = p.TryLease()
	require.ErrorIs(t, err, ErrClosed)
}

// TestL5_AccountingHoldsUnderConcurrency leases, releases and poisons from many goroutines
// while another samples Stats: the sum must equal the total at every sample, and at the end
// every lease has ended in exactly one release or poison.
func TestL5_AccountingHoldsUnderConcurrency(t *testing.T) {
	const slots, workers, rounds = 64, 8, 400
	p, err := New(make([]byte, slots*32), Config{SlotBytes: 32, Concurrency: workers})
	require.NoError(t, err)

	stop := make(chan struct{})
	var sampler sync.WaitGroup
	var bad error
	sampler.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			s := p.Stats()
			if s.Free+s.Leased+s.Poisoned != s.Total || s.Free < 0 || s.Leased < 0 {
				bad = errors.New("inconsistent stats")
				return
			}
		}
	})

	var wg sync.WaitGroup
	poisons := make([]int, workers)
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				s, err := p.Lease(ctx)
				cancel()
				if err != nil {
					continue // every slot may be poisoned by now
				}
				s.Bytes()[0] = byte(w)
				if r.IntN(200) == 0 {
					_ = s.Poison("test")
					poisons[w]++
				} else {
					_ = s.Release()
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	sampler.Wait()
	require.NoError(t, bad)
	total := 0
	for _, n := range poisons {
		total += n
	}
	st := p.Stats()
	require.Equal(t, Stats{Total: slots, Free: slots - total, Poisoned: total}, st)
	require.Len(t, p.Poisoned(), total)
}
