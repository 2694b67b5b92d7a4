// SPDX-License-Identifier: Apache-2.0

// Package hostile is the hostile peer harness (docs/security.md, "The hostile peer harness"):
// a lying peer process (transfer/internal/hostilepeer, built on the engine's own wire code
// over real UCX) sends a victim engine of this process forged RMA offers (ranges outside its
// registration, past its segment, huge, wrapping, in overlapping parts, under garbage and
// truncated keys, in the name of another process's pid, replays of an earlier transfer's
// nonce), forged hellos and proofs, and, with a cluster key, unsealed and foreign hellos,
// forged ContextParams and unproven claims. The victim's pool has canary guard pages and
// canary blocks around the request's, this process and a third process hold canaries at the
// address of the peer's pool, and after every forgery each canary byte must be unchanged,
// the forgery refused with a typed error and counted in the engine's metrics.
//
// Run drives it; the short run is TestHostilePeer_EveryForgeryRefused (make test), the long
// one `make hostile`, and `kvxbench stress --faults hostile` runs it beside a soak. It is
// for tests and soaks, never for serving processes.
package hostile
