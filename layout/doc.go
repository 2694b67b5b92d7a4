// SPDX-License-Identifier: Apache-2.0

// Package layout describes paged KV-cache pools and the byte stream a transfer moves.
//
// It is the Go mirror of include/kvx/kvx_layout.h, the header shared by the CUDA kernels and
// the host gather/scatter in native/. A Layout gives a pool's dimensions and byte strides; a
// Selection picks a layer range and a head range (heterogeneous PP and TP); a Plan adds the
// block ids of one request and defines the stream
//
//	[layer][kv][block i][head][token][head_dim elements]
//
// over the selected layers and heads, in the order the block ids are listed. A sender's plan
// and a receiver's plan describe the same bytes when they select as many layers, heads and
// blocks of the same dimensions, whatever their pools' strides; Compatible checks that.
//
// A program starts with Packed (a Dims and an Order) or a Layout with its own strides,
// Layout.All (or a Selection of its own), and NewPlan with a request's block ids. The stream
// arithmetic the engine and the gather/scatter backends do over a plan (where each unit lies
// in the pool, chunks, runs, partial plans) is theirs, not a program's, and is not exported.
//
// This package holds no memory and imports nothing of kvxfer's, so every layer can use it.
// Reference gather and scatter functions, element by element, live in layouttest.
package layout
