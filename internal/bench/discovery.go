// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/kvxfer/kvxfer/transfer/discovery"
	_ "github.com/kvxfer/kvxfer/transfer/discovery/etcd" // etcd:// targets
)

// --discovery: serve publishes its control address in a registry (etcd://HOST:PORT/PREFIX, or
// an embedded registry's http://HOST:PORT), and connect looks it up there by --peer name
// instead of being told HOST:PORT.

// Discovery is --discovery and the serve's name in it.
type Discovery struct {
	// Target is the registry: etcd://HOST:PORT[,HOST:PORT]/PREFIX or http://HOST:PORT.
	Target string
	// Name is the serve's name: the one it publishes, or the one connect looks up.
	Name string
}

func (d Discovery) open(ttl time.Duration) (discovery.Registry, error) {
	r, err := discovery.Open(d.Target, discovery.Config{TTL: ttl})
	if err != nil {
		return nil, Usagef("--discovery %s: %v", d.Target, err)
	}
	return r, nil
}

// newIncarnation is one life of this serve.
func newIncarnation() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) | 1
}

// publishServe announces serve's control address (advertise) under name; the returned
// function withdraws it.
func publishServe(ctx context.Context, d Discovery, advertise string, httpAddr string) (func(), error) {
	host, _, err := net.SplitHostPort(advertise)
	if err != nil {
		return nil, Usagef("--advertise %q: %v", advertise, err)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return nil, Usagef("--discovery: serve listens on every interface (%s): pass --advertise HOST:PORT, the address the decode host reaches", advertise)
	}
	r, err := d.open(10 * time.Second)
	if err != nil {
		return nil, err
	}
	w := discovery.Worker{Name: d.Name, Role: rolePrefill, Incarnation: newIncarnation(),
		Endpoints: map[string]string{"control": advertise}, Protocol: discovery.BuildProtocol()}
	if httpAddr != "" {
		w.Endpoints["http"] = httpAddr
	}
	if _, err := r.Publish(ctx, w); err != nil {
		_ = r.Close()
		return nil, fmt.Errorf("--discovery %s: publishing %s: %w", d.Target, d.Name, err)
	}
	return func() { _ = r.Close() }, nil
}

// LookupServe finds the control address of the serve called d.Name, waiting up to timeout
// for it to publish.
func LookupServe(ctx context.Context, d Discovery, timeout time.Duration) (string, error) {
	r, err := d.open(10 * time.Second)
	if err != nil {
		return "", err
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	w, err := discovery.WaitFor(ctx, r, d.Name)
	switch {
	case errors.Is(err, discovery.ErrNotFound):
		return "", fmt.Errorf("%w: %s did not appear in %s within %v", errPeerUnreachable, d.Name, d.Target, timeout)
	case err != nil:
		return "", fmt.Errorf("--discovery %s: %w", d.Target, err)
	}
	addr := w.Endpoints["control"]
	if w.Role != rolePrefill || addr == "" {
		return "", fmt.Errorf("--discovery: %s is a %s with no control endpoint, not a kvxbench serve", d.Name, w.Role)
	}
	return addr, nil
}
