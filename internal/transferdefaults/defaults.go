// SPDX-License-Identifier: Apache-2.0

// Package transferdefaults holds the defaults of transfer.Config that the module's own tools
// size against (the benchmarks, the stress harness, the probes' tests). Users read them on
// transfer.Config's fields; package transfer takes its values from here.
package transferdefaults

import "time"

// The defaults of transfer.Config's fields of the same names.
const (
	SlotBytes        = 4 << 20
	DirectChunkBytes = 64 << 20
	MaxConcurrent    = 64
	PipelineDepth    = 2
	ProgressDeadline = 10 * time.Second
	QuarantineBudget = 8
	PoisonedBlocks   = 1024 // transfer.Config.Tuning.PoisonedBlockBudget
	CancelGrace      = 100 * time.Millisecond
)
