// SPDX-License-Identifier: Apache-2.0

package discovery

// The handover: a prefill hands a request's ContextParams to whichever decode takes them,
// under a key both know (the serving engine's request id), through the registry both already
// use. An entry of the registry carries them: named "handover." + key, role HandoverRole, the
// blob in its Address; it lives as a worker's does (renewed, withdrawn, gone within the TTL
// of a publisher that died), so every backend (HTTP, etcd) carries handovers unchanged.

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// handoverRole is the role of a handover's registry entry: List of a worker role never
// returns one.
const handoverRole = "kvxfer-handover"

// handoverName is the registry name of key's handover.
func handoverName(key string) (string, error) {
	name := "handover." + key
	if !nameRE.MatchString(name) {
		return "", fmt.Errorf("%w: handover key %s: letters, digits, '.', '_', '-', at most %d", ErrInvalid, quoteInput(key), 128-len("handover."))
	}
	return name, nil
}

// Hand publishes params (what Engine.Expose returned) under key for the decode that Takes
// them, and withdraws them once done closes (pass the exposure's Handle.Done(): once it is
// claimed or has ended, nobody needs them) or the registry closes. It returns once they are
// published; ctx bounds only that. Publishing a key again replaces its params.
func Hand(ctx context.Context, r Registry, key string, params transport.Params, done <-chan struct{}) error {
	name, err := handoverName(key)
	if err != nil {
		return err
	}
	blob, err := params.MarshalBinary()
	if err != nil {
		return fmt.Errorf("kvxfer/discovery: handover %s: %w", quoteInput(key), err)
	}
	reg, err := r.Publish(ctx, Worker{Name: name, Role: handoverRole, Incarnation: rand.Uint64() | 1, Address: blob})
	if err != nil {
		return err
	}
	go func() { // bounded: done closes when the exposure ends (at most its ExposureTimeout)
		<-done
		wctx, cancel := context.WithTimeout(context.Background(), defaultLookupTimeout)
		defer cancel()
		_ = reg.Withdraw(wctx)
	}()
	return nil
}

// Take waits, bounded by ctx, for the params handed under key and decodes them
// (ucx.UnmarshalContextParams: version, length, checksum and plan checked). Receive them with
// Spec{ID: cp.RequestID, Peer: ucx.PeerFromAddress(cp.WorkerAddress), Secret: cp.Secret} after the checks any
// params get (Engine.VerifyParams with cluster keys; CheckParams against the sender's entry).
// Params not handed before ctx ends fail with an error matching ErrNotFound.
func Take(ctx context.Context, r Registry, key string) (*ucx.ContextParams, error) {
	name, err := handoverName(key)
	if err != nil {
		return nil, err
	}
	w, err := WaitFor(ctx, r, name)
	if err != nil {
		return nil, err
	}
	if w.Role != handoverRole {
		return nil, fmt.Errorf("%w: %s is a worker's entry (role %s), not a handover", ErrInvalid, name, quoteInput(w.Role))
	}
	cp, err := ucx.UnmarshalContextParams(w.Address)
	if err != nil {
		return nil, fmt.Errorf("kvxfer/discovery: handover %s: %w", quoteInput(key), err)
	}
	return cp, nil
}
