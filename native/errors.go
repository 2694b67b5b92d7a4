// SPDX-License-Identifier: Apache-2.0

package native

import "errors"

// Sentinel errors of package native. Typed errors returned by this package match one of them
// (or one of package layout's) through errors.Is.
var (
	// ErrNotSupported: the operation needs something this build or host lacks (cgo, UCX).
	ErrNotSupported = errors.New("kvxfer: not supported")
)
