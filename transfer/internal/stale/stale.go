// SPDX-License-Identifier: Apache-2.0

// Package stale is the error of a ContextParams whose sender's life is over, shared by the
// UCX transport (which checks its own incarnation) and discovery (which checks the registry's).
// Package ucx re-exports ErrStaleIncarnation; callers match that.
package stale

import (
	"errors"
	"fmt"
)

// ErrStaleIncarnation is ucx.ErrStaleIncarnation.
var ErrStaleIncarnation = errors.New("kvxfer: stale incarnation")

// Error says whose incarnation is stale: the one the ContextParams carry (Have) and the one
// current now (Current; zero when the sender is gone).
type Error struct {
	Peer          string
	Have, Current uint64
	Reason        string
}

func (e *Error) Error() string {
	cur := "none"
	if e.Current != 0 {
		cur = fmt.Sprintf("%#x", e.Current)
	}
	return fmt.Sprintf("kvxfer: stale incarnation of %s: params carry %#x, current %s: %s", e.Peer, e.Have, cur, e.Reason)
}

// Unwrap matches ErrStaleIncarnation.
func (e *Error) Unwrap() error { return ErrStaleIncarnation }
