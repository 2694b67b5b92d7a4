// SPDX-License-Identifier: Apache-2.0

// Package streambench measures how much of a KV transfer layer-wise streaming hides behind
// prefill. It simulates prefill as one compute step per layer (a sleep, or a busy loop that
// competes for the CPU), marks each layer ready on a streaming Send as its step ends, and
// reports the exposed transfer time (last layer ready to transfer complete) beside the plain
// transfer time of the same request (start to complete with every layer ready up front).
//
// It backs `kvxbench run --stream` and `go test -run '^$' -bench Stream
// ./internal/streambench/`. Run owns its two engines and closes them before it returns.
package streambench
