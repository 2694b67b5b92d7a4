// SPDX-License-Identifier: Apache-2.0

// Package stress is the fault soak behind `kvxbench stress`: it drives many concurrent
// transfers between a decode engine and two prefill engines (one pairing TP=1 to TP=1, one
// TP=2 to TP=1), injects faults on a schedule (cancel storms, missed deadlines, hung, late and
// never-quiescent chunks, a frozen peer, a lost and restarted peer), and checks the
// invariants that engines which wedge in production break:
//
//   - every handle reaches a terminal state within its deadline plus a grace (nothing wedged);
//   - free + leased + poisoned = total in every staging pool, always, and nothing stays leased
//     after the drain (nothing leaked);
//   - a poisoned slot is never handed to the transport again (tracked by slot index);
//   - every completed transfer's bytes match the sender's checksum (nothing corrupt);
//   - health turns unhealthy within the progress deadline while a peer is frozen, and healthy
//     again within the recovery bound after it is back;
//   - goroutines return to their starting count and the heap stays under a bound.
//
// Run returns a Report whose Breaches list every violation; a run with any breach failed.
// All engines run in one process over mem.Network, whose fault injection stands in
// for the processes and network of a real deployment: a frozen peer is one whose every
// message is held until it thaws (SIGSTOP), a lost peer is cut off with LosePeer and started
// again under a new name (SIGKILL and restart). RunProcesses puts the prefill engines in peer
// processes over UCX instead: each request takes a route of a mix (staging, pull wire, direct,
// RMA, process_vm_readv, and decode as the RMA sender) through registered pools, and the
// lifecycle faults (SIGSTOP, SIGKILL, rolling restarts through a discovery registry, a cut and
// a lossy link) run against real processes. Every wait in this package is bounded.
package stress
