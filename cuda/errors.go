// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"errors"
	"fmt"
	"strings"
)

// Errors of package cuda. Typed errors (*Error, *LibraryError) match them through errors.Is.
var (
	// ErrLibraryNotFound: libcudart or libkvxcuda.so could not be loaded, or lacks a symbol.
	// The host path is the fallback.
	ErrLibraryNotFound = errors.New("cuda: library not found")
	// ErrNoDevice: the libraries loaded but no usable GPU is there: no driver, no device, or
	// an ordinal beyond the devices present.
	ErrNoDevice = errors.New("cuda: no usable CUDA device")
	// ErrABIMismatch: libkvxcuda.so was built from another version of kvx_cuda.h, or against
	// another CUDA major version than the libcudart that was loaded.
	ErrABIMismatch = errors.New("cuda: libkvxcuda ABI mismatch")
	// ErrInvalidArgument: a size, range or handle is wrong; nothing was enqueued.
	ErrInvalidArgument = errors.New("cuda: invalid argument")
	// ErrClosed: the Runtime, Buffer, Stream, Event or DevicePlan was already closed or freed.
	ErrClosed = errors.New("cuda: already closed")
)

// cudaError_t values this package interprets. The full list is in driver_types.h.
const (
	codeSuccess              = 0
	codeInvalidValue         = 1
	codeInsufficientDriver   = 35
	codeNoDevice             = 100
	codeInvalidDevice        = 101
	codeNotReady             = 600
	codeSystemNotReady       = 802
	codeSystemDriverMismatch = 803
	codeCompatNotSupported   = 804
)

// Error is a failed CUDA call: the operation, the cudaError_t and the runtime's name and
// description for it. It matches ErrNoDevice for the codes that mean there is no usable GPU
// (no driver, no device, bad ordinal, driver mismatch) and ErrInvalidArgument for
// cudaErrorInvalidValue.
type Error struct {
	Op      string // the call that failed, e.g. "kvx_cuda_gather"
	Code    int    // the cudaError_t
	Name    string // e.g. "cudaErrorNoDevice"; empty if the runtime could not name it
	Message string // the runtime's description
}

func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = "cudaError"
	}
	if e.Message == "" {
		return fmt.Sprintf("cuda: %s: %s (%d)", e.Op, name, e.Code)
	}
	return fmt.Sprintf("cuda: %s: %s (%d): %s", e.Op, name, e.Code, e.Message)
}

// Is maps CUDA error codes onto the package's sentinels.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrNoDevice:
		switch e.Code {
		case codeInsufficientDriver, codeNoDevice, codeInvalidDevice, codeSystemNotReady,
			codeSystemDriverMismatch, codeCompatNotSupported:
			return true
		}
	case ErrInvalidArgument:
		return e.Code == codeInvalidValue
	}
	return false
}

// LibraryError says which library could not be loaded and every path tried, with why each
// failed. It matches ErrLibraryNotFound.
type LibraryError struct {
	Library string   // "libkvxcuda.so" or "libcudart"
	Tried   []string // each candidate path or soname, in search order
	Reasons []string // the loader's message for each, same order
}

func (e *LibraryError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v: %s; tried", ErrLibraryNotFound, e.Library)
	for i, p := range e.Tried {
		fmt.Fprintf(&b, " [%s: %s]", p, e.Reasons[i])
	}
	return b.String()
}

// Unwrap returns ErrLibraryNotFound.
func (e *LibraryError) Unwrap() error { return ErrLibraryNotFound }
