// SPDX-License-Identifier: Apache-2.0

package buffer

import (
	"errors"
	"fmt"
)

// Errors returned by the pool. Typed errors below match them through errors.Is.
var (
	// ErrInvalidConfig: a Config field cannot work; the error is a *ConfigError naming it.
	ErrInvalidConfig = errors.New("kvxfer/buffer: invalid configuration")
	// ErrUndersized: the pool has fewer slots than the transfers that may hold one at once.
	ErrUndersized = errors.New("kvxfer/buffer: pool smaller than its concurrency")
	// ErrNoSlot: TryLease found no free slot, or Lease's context ended before one freed.
	ErrNoSlot = errors.New("kvxfer/buffer: no free slot")
	// ErrNotLeased: Release or Poison on a slot lease that has already ended.
	ErrNotLeased = errors.New("kvxfer/buffer: slot is not leased")
	// ErrClosed: the pool was closed.
	ErrClosed = errors.New("kvxfer/buffer: pool closed")
)

// ConfigError names the Config field that is wrong, its value, and how to fix it.
type ConfigError struct {
	Field  string
	Value  any
	Reason string
	Err    error // ErrInvalidConfig or ErrUndersized
}

// Error implements error.
func (e *ConfigError) Error() string {
	return fmt.Sprintf("%v: %s = %v: %s", e.Err, e.Field, e.Value, e.Reason)
}

// Unwrap returns the sentinel the error belongs to.
func (e *ConfigError) Unwrap() error { return e.Err }
