// SPDX-License-Identifier: Apache-2.0

// Command kvxbench is kvxfer's benchmark: what an engineer runs first to see what kvxfer does
// on their machines, and what `make bench` runs.
//
// Every figure it prints comes with the limit it should be compared to, measured in the same
// run: host gather and scatter against memcpy of the same bytes (native.HostCopy), transfers
// against ucx_perftest at the same message size and transport between the same two
// endpoints. Machines are noisy, so baselines run in turn with the measured operation rather
// than in a separate session.
//
// Subcommands:
//
//	run       loopback transfer between two processes on this host (the default);
//	          run --stream measures layer-wise streaming beside simulated prefill
//	gather    host (or device) gather and scatter alone, against memcpy
//	sweep     block size by batch size, for tuning
//	serve     the prefill end on one host; prints the address to give to connect
//	connect   the decode end: connect ADDR
//	devices   the GPUs NVML reports (cuda/gpuinfo), which --device picks from
//	stress    the fault soak of internal/stress
//	help      usage of every subcommand
//
// Transfers take the engine's one-copy direct path by default (both ends' pools mapped by the
// UCX transport), reading the prefill pool with RMA gets where the layouts line up; --no-rma
// keeps the direct path on IOV messages, --staging forces the staging path, and every
// transfer row says which ran (rma, direct or staging, as the engine's handles report).
//
// # Where the code is
//
// This package is flags and subcommands only: main.go lists the subcommands (commands) and
// maps errors to exit codes; flags.go, flags_layout.go and flags_transfer.go turn flags into
// the configurations of package internal/bench; each cmd_NAME.go is one subcommand's flags and
// its call into internal/bench (cmd_run.go holds run and the hidden peer, cmd_serve.go serve,
// connect and sweep). To add a subcommand, write its cmd_NAME.go, add it to commands(), and
// put what it measures in internal/bench.
//
// The CLI is a function of its arguments and writers (Main), so tests drive it in-process;
// only run's loopback peer is a second process (kvxbench re-executing itself as the hidden
// peer subcommand). Every wait is bounded: each subcommand runs under a deadline derived from
// its flags, child processes are killed with their process group when it passes, and a peer
// that does not answer is an error after --connect-timeout.
package main
