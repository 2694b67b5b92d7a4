// SPDX-License-Identifier: Apache-2.0

// Package native is kvxfer's only door to C: the host gather and scatter built on the shared
// layout header (include/kvx/kvx_layout.h), and the UCX transport layer. Every other package
// sees Go types only.
//
// The C sources next to these files are compiled twice: by cgo for Go, and by CMake, with
// AddressSanitizer and UndefinedBehaviorSanitizer, for the C tests under native/test.
//
// Memory handed to the host calls is read or written only for the duration of the call; no
// C code here keeps a Go pointer.
package native
