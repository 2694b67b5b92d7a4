// SPDX-License-Identifier: Apache-2.0

//go:build !cgo

package native

import (
	"fmt"

	"github.com/kvxfer/kvxfer/layout"
)

// HostGather needs the C gather; this build has no cgo.
func HostGather(p *layout.Plan, pool []byte, off int64, dst []byte) error {
	return fmt.Errorf("%w: host gather needs cgo (build with CGO_ENABLED=1)", ErrNotSupported)
}

// HostScatter needs the C scatter; this build has no cgo.
func HostScatter(p *layout.Plan, src []byte, off int64, pool []byte) error {
	return fmt.Errorf("%w: host scatter needs cgo (build with CGO_ENABLED=1)", ErrNotSupported)
}

// HostCopy falls back to Go's copy without cgo.
func HostCopy(dst, src []byte) { copy(dst, src) }

// HostCopyStreaming falls back to Go's copy without cgo.
func HostCopyStreaming(dst, src []byte) { copy(dst, src) }

// UCXVersion is empty: a build without cgo links no UCX.
func UCXVersion() string { return "" }

// systemDevices is 0: a build without cgo links no UCX to count them.
func systemDevices() int { return 0 }

// Settings is nil: a build without cgo opens no UCX context.
func Settings() []string { return nil }
