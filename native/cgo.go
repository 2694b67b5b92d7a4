// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

// The cgo flags of the package live here, in one place. The C sources in this directory are
// compiled with them. UCX comes from the system and is found through pkg-config (Debian:
// libucx-dev); `make deps` installs it. The layout header shared with
// the CUDA kernels is include/kvx/kvx_layout.h, found through -I.

/*
#cgo CFLAGS: -O3 -std=gnu11 -Wall -I${SRCDIR}/../include
#cgo pkg-config: ucx
*/
import "C"
