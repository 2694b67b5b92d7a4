// SPDX-License-Identifier: Apache-2.0

// Command disagg is a runnable tour of kvxfer in disaggregated serving: a prefill worker and a
// decode worker, each with a registered KV pool and a kvxfer engine, hand a request's
// ContextParams over a small HTTP control plane on 127.0.0.1, move one request's KV blocks,
// abort a second before it moves and give up on a third in flight, and print what happened
// to each request's blocks.
//
// Usage:
//
//	go run ./examples/disagg -transport=mem
//
// With -transport=mem (today's only mode) both workers run in this one process over the
// in-memory transport, still talking to each other only through the HTTP control plane and
// the engines. A UCX mode, with the two roles in two processes, comes when the UCX transport
// lands; the roles are written so that only the transport changes.
//
// The prefill worker's control listener also serves /healthz and /metrics (package
// transfer/observe) for as long as the program runs.
package main
