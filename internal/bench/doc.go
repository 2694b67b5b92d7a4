// SPDX-License-Identifier: Apache-2.0

// Package bench is what kvxbench measures and how: the transfer scenarios and their decode
// and prefill ends, the JSON control protocol between the two processes (or hosts) of a run,
// the ucx_perftest baseline, host and device gather, streaming, the results' table, JSON
// lines and plot. cmd/kvxbench holds only its flags and subcommands: it turns flags into the
// configurations defined here (RunConfig, GatherConfig) and calls one entry point per
// subcommand (Loopback, Sweep, Serve, Connect, Gather, Stream, Peer).
//
// Files by subject:
//
//	config.go                 RunConfig (what both ends of a run agree on) and pool sizing
//	presets.go                model presets and pool shapes
//	run.go                    the loopback run: prefill peers as second processes
//	serve.go                  the two-host run (Serve, Connect) and Sweep
//	control.go                the control protocol: hello, addresses, requests, bye
//	scenario.go               the decode and prefill ends of one scenario, measured
//	engine*.go                the engine behind an interface the scenarios drive
//	device*.go                --memory device: device gather and the device engine side
//	gpu*.go                   --device and `kvxbench devices`: the GPUs NVML reports
//	perftest/                 the ucx_perftest baseline (a server and a client, bounded)
//	gather.go, stream.go      host gather and scatter; layer-wise streaming
//	report.go, progress.go    results as a table, JSON lines (resultSchema) and progress
//	plot/                     the SVG plot
//
// Every wait is bounded: each entry point runs under a deadline derived from its
// configuration, child processes are killed with their process group when it passes, and a
// peer that does not answer is an error after RunConfig.ConnectTimeout.
package bench
