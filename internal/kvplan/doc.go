// SPDX-License-Identifier: Apache-2.0

// Package kvplan is the stream arithmetic over a layout.Plan that the engine, the transports,
// the gather/scatter backends (native, cuda) and the benchmarks use, and a program never calls:
// where each stream unit lies in the pool (UnitOffset, RunUnits, Runs), how a stream is cut
// into chunks (Chunks, CheckRange), the Shape two peers compare, and partial plans
// (WithoutPositions). It mirrors include/kvx/kvx_layout.h as package layout does; layout keeps
// what a program describes a pool and a request with (Dims, Layout, Selection, NewPlan).
package kvplan
