// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/transfer/discovery"
	_ "github.com/kvxfer/kvxfer/transfer/discovery/etcd" // etcd:// targets
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// The workers find each other through a registry (package discovery): by default the
// embedded one the prefill worker serves on its control plane (/v1/workers), or etcd with
// -discovery=etcd://HOST:PORT/PREFIX. Each publishes its name, role, incarnation, transport
// address and control endpoint; the decode worker looks the prefill worker up by name, and
// checks every ContextParams against the registry before pulling, so params of a prefill
// life that is over fail at once with ucx.ErrStaleIncarnation.

// Names the two workers publish under.
const (
	prefillName = "prefill-0"
	decodeName  = "decode-0"
)

// registryTTL is how long a dead worker's entry lasts.
const registryTTL = 5 * time.Second

// openRegistry opens the registry at target ("http://..." or "etcd://...").
func openRegistry(target string) (discovery.Registry, error) {
	r, err := discovery.Open(target, discovery.Config{TTL: registryTTL, LookupTimeout: 20 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("-discovery=%s: %w", target, err)
	}
	return r, nil
}

// publish announces a worker: its engine's life and address, and its control plane.
func publish(ctx context.Context, r discovery.Registry, name, role string, fab fabric, control string) error {
	// The registry fills in Protocol (the wire versions and features this build speaks).
	w := discovery.Worker{Name: name, Role: role, Incarnation: fab.incarnation(), Address: fab.address()}
	if control != "" {
		w.Endpoints = map[string]string{"control": control}
	}
	if _, err := r.Publish(ctx, w); err != nil {
		return fmt.Errorf("publishing %s: %w", name, err)
	}
	return nil
}

// findPrefill waits (bounded by ctx) for the prefill worker to appear and returns its
// control plane's URL.
func findPrefill(ctx context.Context, r discovery.Registry) (string, error) {
	w, err := discovery.WaitFor(ctx, r, prefillName)
	if err != nil {
		return "", err
	}
	if c := w.Endpoints["control"]; c != "" {
		return c, nil
	}
	return "", fmt.Errorf("%s published no control endpoint", prefillName)
}

// checkParams refuses params of a prefill life that is over: one the engine's transport lost,
// or one the registry no longer lists.
func checkParams(ctx context.Context, r discovery.Registry, cp *ucx.ContextParams, lost discovery.LostPeers) error {
	if r == nil {
		return lost.PeerLost(ucx.PeerFromAddress(cp.WorkerAddress))
	}
	return discovery.CheckParams(ctx, r, prefillName, cp, lost)
}
