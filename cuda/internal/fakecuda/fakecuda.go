// SPDX-License-Identifier: Apache-2.0

package fakecuda

// Faults are the results the fake's entry points return, each a cudaError_t asked at every
// call (nil, or 0: success).
type Faults struct {
	// Launch answers kvx_cuda_gather and kvx_cuda_scatter; op is "gather" or "scatter".
	Launch func(op string) int32
	// EventRecord answers kvx_cuda_event_record.
	EventRecord func() int32
	// EventQuery answers kvx_cuda_event_query (600, cudaErrorNotReady: not done yet).
	EventQuery func() int32
}

// NewRuntime returns a *cuda.Runtime (as any) over f. Package cuda's init sets it.
var NewRuntime func(f *Faults) any
