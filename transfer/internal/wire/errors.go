// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"errors"
	"fmt"
)

// ErrMalformed: wire bytes do not decode; the error is a *DecodeError.
var ErrMalformed = errors.New("kvxfer: malformed wire message")

// DecodeError says why wire bytes did not decode. It matches ErrMalformed.
type DecodeError struct {
	Offset int
	Reason string
}

// Error implements error.
func (e *DecodeError) Error() string {
	return fmt.Sprintf("%v: at byte %d: %s", ErrMalformed, e.Offset, e.Reason)
}

// Unwrap returns ErrMalformed.
func (e *DecodeError) Unwrap() error { return ErrMalformed }
