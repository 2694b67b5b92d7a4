// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

// The cgo flags of the package live here, in one place. The C sources in this directory are
// compiled with them.

/*
#cgo CFLAGS: -O3 -std=gnu11 -Wall
*/
import "C"
