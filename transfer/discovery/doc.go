// SPDX-License-Identifier: Apache-2.0

// Package discovery lets prefill and decode workers find each other: each publishes its
// identity (name, role, incarnation, transport address, named endpoints, protocol version
// and features) and looks the others up by name or role.
//
// A program starts with Open (a target and a Config), Registry.Publish and WaitFor (or
// Registry.Lookup), Hand and Take to pass a request's ContextParams by name, CheckParams on a
// request's ContextParams, and Handler (on its own mux, or as observe.HandlerConfig.Registry
// beside the probes) where it hosts the embedded registry.
//
// One interface, Registry, has two backends, chosen by Open's target:
//
//	http://HOST:PORT              the embedded default: a small HTTP registry (Handler)
//	                              that one process of the deployment runs; needs nothing else
//	etcd://HOST:PORT[,HOST:PORT]/PREFIX
//	                              etcd (v3 API), the store a serving cluster already runs;
//	                              linked only by importing transfer/discovery/etcd
//
// Whatever the backend, its answers are input: Open checks every entry a lookup returns as
// Publish checks a Worker, and errors quote at most 64 bytes of anything they name.
//
// Both keep an entry alive only while its worker does: Publish holds a lease of Config.TTL
// (etcd's lease; a heartbeat for the HTTP registry) and renews it until Withdraw or Close, so
// a worker that dies disappears within the TTL, and one that restarts publishes a new
// Incarnation under the same name. CheckParams compares a ContextParams with what the
// receiving engine's transport knows (LostPeers: a sender it lost fails with ErrPeerLost,
// before its entry's TTL runs out) and what the registry says of its sender now, and fails
// with ucx.ErrStaleIncarnation when the sender has died or restarted since, so a request is
// never pulled from the wrong life.
//
// Lookups retry an unreachable registry with exponential backoff, bounded by
// Config.LookupTimeout, then fail with an error matching ErrUnavailable. A registry going
// away touches nothing already found: transfers under way run on the transport, not here.
package discovery
