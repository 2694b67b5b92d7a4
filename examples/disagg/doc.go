// SPDX-License-Identifier: Apache-2.0

// Command disagg is a runnable tour of kvxfer in disaggregated serving: a prefill worker and a
// decode worker, each with a KV pool and a kvxfer engine (over UCX; each pool is mmap'd by the
// worker and registered with the transport, so blocks move by RMA straight between the pools), hand each request's
// ContextParams over a small HTTP control plane on 127.0.0.1, move one request's KV blocks,
// abort a second before it moves and give up on a third (one the prefill worker never sends) in flight, and print what happened
// to each request's blocks.
//
// Usage:
//
//	go run ./examples/disagg                  # UCX, two processes
//	go run ./examples/disagg -transport=mem   # one process, in-memory transport
//
// With -transport=ucx (the default) this process is the prefill worker: it opens a UCX
// worker, serves the control plane and starts the decode worker as a second process, this
// same binary with -role=decode. The decode process fetches each request's ContextParams
// (a binary blob, application/octet-stream) from the control plane and Receives from the
// prefill engine named in it; data moves over UCX (shared memory by default, -tls), never
// over HTTP. Each process prints what happened to its own blocks. The prefill process
// waits for the decode process, bounded by -timeout, and on every exit path interrupts,
// then kills and always reaps it; on Linux the kernel kills it too if the prefill process
// dies first.
//
// To run the two roles by hand, in two terminals:
//
//	go run ./examples/disagg -role=prefill -control=127.0.0.1:8400
//	go run ./examples/disagg -role=decode -control=127.0.0.1:8400
//
// The prefill process reports and exits once the decode process says it is done.
//
// With -transport=mem both workers run in this one process over the in-memory transport,
// still talking to each other only through the control plane and the engines; only there
// can -freeze stop the wire under a fourth request to show /healthz turning 503 and back.
//
// The prefill worker's control listener also serves /healthz and /metrics (package
// transfer/observe) for as long as the program runs.
package main
