// SPDX-License-Identifier: Apache-2.0

package transfer

import "github.com/kvxfer/kvxfer/cuda"

// A CUDA event recorded after a layer range's kernels is a readiness signal as it is:
// Event.Query is cudaEventQuery, which never blocks. Only this test imports cuda; the engine
// sees the interface.
var _ ReadySignal = (*cuda.Event)(nil)
