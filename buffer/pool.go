// SPDX-License-Identifier: Apache-2.0

package buffer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Config sizes a Pool. Zero values take the documented defaults; New validates the result
// once and names the first field that cannot work.
type Config struct {
	// SlotBytes is the size of every slot. Required, positive, at most the memory handed in.
	SlotBytes int64
	// Concurrency is the most transfers that may hold a slot at the same time. The pool must
	// have at least this many slots, or it could wedge under load (see the package doc).
	// Default 1.
	Concurrency int
	// LeaseTimeout bounds Lease when its context carries no deadline, so no lease waits
	// forever. Default 30s.
	LeaseTimeout time.Duration
	// Logger receives poison events. Default zap.NewNop().
	Logger *zap.Logger
}

// Default values of Config's optional fields.
const (
	DefaultConcurrency  = 1
	DefaultLeaseTimeout = 30 * time.Second
)

func (c Config) withDefaults() Config {
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.LeaseTimeout == 0 {
		c.LeaseTimeout = DefaultLeaseTimeout
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c
}

// Stats is a consistent snapshot of a pool: Free + Leased + Poisoned == Total.
type Stats struct {
	Total    int
	Free     int
	Leased   int
	Poisoned int
}

// PoisonRecord says which slot was taken out of circulation, when and why.
type PoisonRecord struct {
	Slot   int
	At     time.Time
	Reason string
}

// Pool hands out fixed-size slots of caller memory. It never allocates slot memory itself
// and never frees the memory it was given: the caller owns it and must keep it alive (and,
// for registered memory, registered) until the pool is closed and every lease has ended.
type Pool struct {
	cfg    Config
	mem    []byte
	free   chan int // indices of free slots; capacity = total, so sends never block
	closed chan struct{}
	once   sync.Once

	mu       sync.Mutex // guards the counters and poison list, which move together
	nFree    int
	nLeased  int
	poisoned []PoisonRecord
}

// New carves mem into len(mem)/SlotBytes slots (a remainder is left unused) and checks that
// they are enough for cfg.Concurrency.
func New(mem []byte, cfg Config) (*Pool, error) {
	cfg = cfg.withDefaults()
	switch {
	case cfg.SlotBytes <= 0:
		return nil, &ConfigError{Field: "SlotBytes", Value: cfg.SlotBytes, Reason: "must be positive", Err: ErrInvalidConfig}
	case cfg.SlotBytes > int64(len(mem)):
		return nil, &ConfigError{Field: "SlotBytes", Value: cfg.SlotBytes,
			Reason: fmt.Sprintf("larger than the %d bytes of memory handed in", len(mem)), Err: ErrInvalidConfig}
	case cfg.Concurrency < 0:
		return nil, &ConfigError{Field: "Concurrency", Value: cfg.Concurrency, Reason: "must be positive", Err: ErrInvalidConfig}
	case cfg.LeaseTimeout < 0:
		return nil, &ConfigError{Field: "LeaseTimeout", Value: cfg.LeaseTimeout, Reason: "must be positive", Err: ErrInvalidConfig}
	}
	n := int(int64(len(mem)) / cfg.SlotBytes)
	if n < cfg.Concurrency {
		return nil, &ConfigError{Field: "Concurrency", Value: cfg.Concurrency, Err: ErrUndersized,
			Reason: fmt.Sprintf("needs at least %d slots (%d bytes of %d-byte slots) so every concurrent transfer can hold one; "+
				"the memory holds %d: add memory, shrink SlotBytes, or lower Concurrency",
				cfg.Concurrency, int64(cfg.Concurrency)*cfg.SlotBytes, cfg.SlotBytes, n)}
	}
	p := &Pool{cfg: cfg, mem: mem, free: make(chan int, n), closed: make(chan struct{}), nFree: n}
	for i := range n {
		p.free <- i
	}
	return p, nil
}

// SlotBytes is the size of every slot.
func (p *Pool) SlotBytes() int64 { return p.cfg.SlotBytes }

// Total is the number of slots, poisoned ones included.
func (p *Pool) Total() int { return cap(p.free) }

// Stats returns a consistent snapshot of the slot counts.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{Total: cap(p.free), Free: p.nFree, Leased: p.nLeased, Poisoned: len(p.poisoned)}
}

// Poisoned returns a copy of the poison records, oldest first.
func (p *Pool) Poisoned() []PoisonRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]PoisonRecord(nil), p.poisoned...)
}

// TryLease returns a free slot at once, or ErrNoSlot.
func (p *Pool) TryLease() (*Slot, error) {
	select {
	case <-p.closed:
		return nil, ErrClosed
	default:
	}
	select {
	case i := <-p.free:
		return p.leased(i), nil
	default:
		return nil, ErrNoSlot
	}
}

// Lease waits for a free slot until ctx is done (or, if ctx has no deadline, at most
// Config.LeaseTimeout). The error wraps ErrNoSlot and the context's error, or is ErrClosed.
func (p *Pool) Lease(ctx context.Context) (*Slot, error) {
	if s, err := p.TryLease(); err != ErrNoSlot {
		return s, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.LeaseTimeout)
		defer cancel()
	}
	select {
	case i := <-p.free:
		return p.leased(i), nil
	case <-p.closed:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %w", ErrNoSlot, context.Cause(ctx))
	}
}

func (p *Pool) leased(i int) *Slot {
	p.mu.Lock()
	p.nFree--
	p.nLeased++
	p.mu.Unlock()
	off := int64(i) * p.cfg.SlotBytes
	return &Slot{pool: p, index: i, mem: p.mem[off : off+p.cfg.SlotBytes : off+p.cfg.SlotBytes]}
}

// Close stops new leases; Lease and TryLease return ErrClosed afterwards. Leases already
// out stay valid and must still end in Release or Poison. Close is idempotent.
func (p *Pool) Close() {
	p.once.Do(func() { close(p.closed) })
}

// Slot is one lease of one slot. Each lease is a new *Slot, so a stale Release of an old lease
// can never hand back a slot someone else now holds.
type Slot struct {
	pool  *Pool
	index int
	mem   []byte
	ended atomic.Bool
}

// Index is the slot's position in the pool, stable across leases (for logs and poison
// records).
func (s *Slot) Index() int { return s.index }

// Bytes is the slot's memory. It belongs to the leaseholder until Release or Poison; reading
// or writing it afterwards is a bug.
func (s *Slot) Bytes() []byte { return s.mem }

// Release returns the slot to the pool. Call it only once the transport is done with the
// memory. A second Release or a Release after Poison returns ErrNotLeased and changes nothing.
func (s *Slot) Release() error {
	if !s.ended.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: slot %d", ErrNotLeased, s.index)
	}
	p := s.pool
	p.mu.Lock()
	p.nLeased--
	p.nFree++
	p.mu.Unlock()
	p.free <- s.index // cannot block: the channel has room for every slot
	return nil
}

// Poison takes the slot out of circulation for good: use it when the transport may still
// touch the memory and that can never be ruled out. A Poison after the lease ended returns
// ErrNotLeased and changes nothing.
func (s *Slot) Poison(reason string) error {
	if !s.ended.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: slot %d", ErrNotLeased, s.index)
	}
	p := s.pool
	p.mu.Lock()
	p.nLeased--
	p.poisoned = append(p.poisoned, PoisonRecord{Slot: s.index, At: time.Now(), Reason: reason})
	poisoned := len(p.poisoned)
	p.mu.Unlock()
	p.cfg.Logger.Warn("staging slot poisoned", zap.Int("slot", s.index), zap.String("reason", reason),
		zap.Int("poisoned", poisoned), zap.Int("total", cap(p.free)))
	return nil
}
