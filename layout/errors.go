// SPDX-License-Identifier: Apache-2.0

package layout

import (
	"errors"
	"fmt"
)

// Errors returned by layout validation and planning. Each is wrapped in a *FieldError that
// names the offending field; test for them with errors.Is.
var (
	// ErrInvalidLayout: a dimension, element size or stride cannot describe real memory.
	ErrInvalidLayout = errors.New("kvxfer: invalid layout")
	// ErrOutOfRange: a block id, layer or head range lies outside the layout.
	ErrOutOfRange = errors.New("kvxfer: out of range")
	// ErrDuplicateBlock: a plan names the same block twice.
	ErrDuplicateBlock = errors.New("kvxfer: duplicate block id")
	// ErrBufferTooSmall: a pool or stream buffer is smaller than the plan needs.
	ErrBufferTooSmall = errors.New("kvxfer: buffer too small")
	// ErrIncompatible: two plans do not describe the same byte stream.
	ErrIncompatible = errors.New("kvxfer: incompatible plans")
)

// FieldError says which field of a layout, selection or plan is wrong, its value and why.
// It matches its sentinel (ErrInvalidLayout, ErrOutOfRange, ...) through errors.Is.
type FieldError struct {
	Field  string
	Value  int64
	Reason string
	Err    error
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%v: %s = %d: %s", e.Err, e.Field, e.Value, e.Reason)
}

// Unwrap returns the sentinel the error belongs to.
func (e *FieldError) Unwrap() error { return e.Err }

func invalid(field string, v int64, reason string) error {
	return &FieldError{Field: field, Value: v, Reason: reason, Err: ErrInvalidLayout}
}

func rangeErr(field string, v int64, reason string) error {
	return &FieldError{Field: field, Value: v, Reason: reason, Err: ErrOutOfRange}
}
