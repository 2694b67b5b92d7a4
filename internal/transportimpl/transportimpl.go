// SPDX-License-Identifier: Apache-2.0

// Package transportimpl is the route from the transport a program holds to the value that
// keeps the whole transport contract behind it. A transport package whose public type shows a
// program only what it calls (ucx.Transport: New, the pool's registration, StagingMemory,
// ContextParams, Close) keeps its optional
// capabilities (transport.DirectTransport, RMATransport, ... : what only the engine calls) on
// an unexported implementation, and registers here, from its init, how to find that
// implementation. transfer.New resolves the transport it is given through Of, so the engine
// still finds every capability by type assertion; so do the contract tests, the stress
// harness and the benchmarks. A transport that is its own implementation (the in-memory one)
// registers nothing and resolves to itself.
package transportimpl

import "sync"

// A Resolver returns the implementation behind tr, and whether tr is a public type of its
// package.
type Resolver func(tr any) (impl any, ok bool)

var (
	mu        sync.RWMutex
	resolvers []Resolver
)

// Register adds a transport package's Resolver. Call it from the package's init.
func Register(r Resolver) {
	mu.Lock()
	defer mu.Unlock()
	resolvers = append(resolvers, r)
}

// Of returns the implementation behind tr: what a registered Resolver finds for it, or tr
// itself (a transport that keeps its contract itself, as the in-memory one does). The caller
// asserts what it needs of it (transport.Transport, a capability); a nil tr gives nil. It
// imports nothing of kvxfer's, so package transfer may use it (internal/importcheck).
func Of(tr any) any {
	if tr == nil {
		return nil
	}
	mu.RLock()
	defer mu.RUnlock()
	for _, r := range resolvers {
		if impl, ok := r(tr); ok {
			return impl
		}
	}
	return tr
}

// RMAServing is an optional capability of a transport.RMATransport whose RMA can be off in one
// instance though its type has the methods: the UCX transport over TCP only, which opens UCX
// without RMA unless ucx.Config.ServeEmulatedRMA is set, so that no peer reaches UCX's
// emulation of it (docs/security.md). When ServesRMA reports false the transport posts no
// gets and serves none of its peers': its RMA calls fail, and the engine takes no route that
// needs them (the RMA mode, the pull wire, one-hop reads, device gets); it declines a peer's
// request for an offer or for its slots, and the data moves by messages. A transport without
// this method serves RMA wherever it is an RMATransport. It lives here, not in package
// transport, because only the engine and the contract tests ask for it.
type RMAServing interface {
	// ServesRMA reports whether this transport posts and serves gets. It never changes.
	ServesRMA() bool
}
