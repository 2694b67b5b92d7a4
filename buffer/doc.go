// SPDX-License-Identifier: Apache-2.0

// Package buffer is kvxfer's staging-slot pool: fixed-size slots carved out of memory the
// caller hands in (host memory now; registered or device memory later).
//
// A transfer leases a slot, lets the transport read or write it, and gives it back in exactly
// one of two ways:
//
//   - Slot.Release, once the transport has proven it is done with the memory;
//   - Slot.Poison, when that can never be proven: the slot leaves circulation for good, is
//     counted and logged, and nothing ever hands it out again.
//
// Stats reports total, free, leased and poisoned slots; free + leased + poisoned = total at
// every instant, because all three move under one lock.
//
// Sizing is checked once, in New: a pool with fewer slots than the number of transfers that
// may hold one at the same time is refused, with an error that says how many are needed. A
// pool sized below concurrency does not fail in tests; it wedges under load, so it is refused
// before it can.
//
// Lease waits at most until its context is done, and never without a bound: a context
// without a deadline gets the pool's Config.LeaseTimeout.
package buffer
