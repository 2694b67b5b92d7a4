// SPDX-License-Identifier: Apache-2.0

package cudatest

import (
	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/cuda/internal/fakecuda"
)

// Faults are the cudaError_t codes the fake's entry points return, asked at every call; a
// nil hook, or 0, is success. See fakecuda.Faults for each field.
type Faults = fakecuda.Faults

// Code values a Faults hook may return.
const (
	Success  int32 = 0
	NotReady int32 = 600 // cudaErrorNotReady: an event or stream not done yet
	Launch   int32 = 719 // cudaErrorLaunchFailure: a sticky kernel fault
)

// NewRuntime returns a fake Runtime that answers through f. f is read at each call, so a test
// may change its hooks (under its own synchronisation) between calls.
func NewRuntime(f *Faults) *cuda.Runtime { return fakecuda.NewRuntime(f).(*cuda.Runtime) }
