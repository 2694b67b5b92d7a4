// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

// The cgo flags of the package live here, in one place. The C sources in this directory are
// compiled with them. UCX comes from the system and is found through pkg-config (Debian:
// libucx-dev); `make deps` installs it.

/*
#cgo CFLAGS: -O3 -std=gnu11 -Wall
#cgo pkg-config: ucx
*/
import "C"
