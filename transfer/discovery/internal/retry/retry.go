// SPDX-License-Identifier: Apache-2.0

// Package retry is how every registry backend of package discovery asks its store: Retry,
// bounded by Config.LookupTimeout, and the errors it tells apart. Package discovery re-exports
// the sentinels; the backends (discovery's HTTP client, discovery/etcd) call Retry.
package retry

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The sentinels of package discovery, defined once here (discovery re-exports them).
var (
	// ErrNotFound: no live worker has that name (it never published, withdrew, or died and
	// its lease ran out).
	ErrNotFound = errors.New("kvxfer/discovery: no such worker")
	// ErrUnavailable: the registry did not answer within Config.LookupTimeout, retries
	// included.
	ErrUnavailable = errors.New("kvxfer/discovery: registry unavailable")
	// ErrInvalid: a Worker, target or Config is malformed; nothing was published.
	ErrInvalid = errors.New("kvxfer/discovery: invalid input")
	// ErrClosed: the Registry is closed.
	ErrClosed = errors.New("kvxfer/discovery: registry closed")
)

// UnavailableError says which registry did not answer, how often it was asked, and the last
// failure. It matches ErrUnavailable and the last failure.
type UnavailableError struct {
	Target   string
	Op       string
	Attempts int
	Err      error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("kvxfer/discovery: %s on %s: no answer after %d attempts: %v", e.Op, e.Target, e.Attempts, e.Err)
}

// Unwrap matches ErrUnavailable and the last failure.
func (e *UnavailableError) Unwrap() []error { return []error{ErrUnavailable, e.Err} }

// Retry runs op until it succeeds, fails for good (an error matching ErrNotFound, ErrInvalid
// or ErrClosed), ctx ends or bound passes, backing off from 20ms, doubling to 500ms; then it
// fails with an *UnavailableError naming target and what. Backends use it for every call to
// their store, so every backend keeps Config.LookupTimeout the same way.
func Retry(ctx context.Context, bound time.Duration, target, what string, op func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	wait := 20 * time.Millisecond
	var last error
	for attempt := 1; ; attempt++ {
		last = op(ctx)
		if last == nil || errors.Is(last, ErrNotFound) || errors.Is(last, ErrInvalid) || errors.Is(last, ErrClosed) {
			return last
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return &UnavailableError{Target: target, Op: what, Attempts: attempt, Err: last}
		case <-t.C:
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}
