// SPDX-License-Identifier: Apache-2.0

// Package tuning holds the knobs of a transfer.Engine that a serving program leaves at their
// defaults: how the staging pool is cut (NumSlots, PipelineDepth), which data path a pair
// takes and from what sizes (the Disable* switches, the *MinRegionBytes and DirectMinRunBytes
// thresholds, DirectChunkBytes), the health budgets, and the protocol's retry and memory
// bounds. They go in transfer.Config.Tuning; the zero Config takes every default.
//
// Who imports it: benchmarks and measurements that pin a path (cmd/kvxbench), the module's
// stress and fault-injection harnesses, and an operator who has measured that a default does
// not fit a deployment (docs/onecopy.md and docs/benchmarks.md say what each threshold trades).
// A serving program starts with package transfer alone: what it must decide (slot size,
// concurrency, staging memory, deadlines, cluster keys, logger, observer) is on
// transfer.Config itself.
package tuning
