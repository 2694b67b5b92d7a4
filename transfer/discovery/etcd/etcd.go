// SPDX-License-Identifier: Apache-2.0

package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/transfer/discovery"
	"github.com/kvxfer/kvxfer/transfer/discovery/internal/retry"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func init() { discovery.RegisterBackend("etcd", open) }

// open opens "etcd://HOST:PORT[,HOST:PORT...][/PREFIX]" (default prefix "/kvxfer").
func open(target string, u *url.URL, cfg discovery.Config) (discovery.Registry, error) {
	if u.Host == "" {
		return nil, fmt.Errorf("%w: target %q: no endpoints (etcd://HOST:PORT[,HOST:PORT]/PREFIX)", discovery.ErrInvalid, target)
	}
	prefix := strings.TrimSuffix(u.Path, "/")
	if prefix == "" {
		prefix = "/kvxfer"
	}
	var eps []string
	for _, h := range strings.Split(u.Host, ",") {
		eps = append(eps, "http://"+h)
	}
	return newEtcdRegistry(target, eps, prefix, cfg)
}

// etcdRegistry keeps each worker under PREFIX/workers/NAME, its value the discovery.Worker as JSON,
// attached to a lease of discovery.Config.TTL that the publisher keeps alive.
type etcdRegistry struct {
	target string
	prefix string
	cfg    discovery.Config
	cli    *clientv3.Client

	mu     sync.Mutex
	closed bool
	regs   map[*etcdRegistration]struct{}
}

func newEtcdRegistry(target string, endpoints []string, prefix string, cfg discovery.Config) (*etcdRegistry, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: cfg.LookupTimeout,
		Logger: cfg.Logger.Named("etcd-client").WithOptions(zap.IncreaseLevel(zap.ErrorLevel)),
		// Fail over to another endpoint, and notice a dead connection, within a TTL.
		DialKeepAliveTime: cfg.TTL, DialKeepAliveTimeout: cfg.TTL})
	if err != nil {
		return nil, fmt.Errorf("%w: etcd client for %s: %v", discovery.ErrInvalid, target, err)
	}
	return &etcdRegistry{target: target, prefix: prefix + "/workers/", cfg: cfg, cli: cli, regs: map[*etcdRegistration]struct{}{}}, nil
}

// attempt bounds one call, so a retry loop notices an unreachable etcd within its bound.
const attempt = time.Second

// call bounds each attempt of op to a quarter of the lookup bound (at most attempt): etcd's
// client waits for a connection until its context ends, so an unbounded attempt would spend
// the whole bound on one try.
func (r *etcdRegistry) call(ctx context.Context, op func(ctx context.Context) error) func(ctx context.Context) error {
	per := min(attempt, max(r.cfg.LookupTimeout/4, 20*time.Millisecond))
	return func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, per)
		defer cancel()
		return op(actx)
	}
}

func (r *etcdRegistry) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// Publish implements discovery.Registry.
func (r *etcdRegistry) Publish(ctx context.Context, w discovery.Worker) (discovery.Registration, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	value, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", discovery.ErrInvalid, err)
	}
	reg := &etcdRegistration{r: r, w: w, key: r.prefix + w.Name, value: string(value), stop: make(chan struct{}), done: make(chan struct{})}
	var lease clientv3.LeaseID
	err = retry.Retry(ctx, r.cfg.LookupTimeout, r.target, "publish "+w.Name, r.call(ctx, func(ctx context.Context) error {
		if r.isClosed() {
			return discovery.ErrClosed
		}
		var err error
		lease, err = reg.put(ctx)
		return err
	}))
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		_, _ = r.cli.Revoke(context.Background(), lease)
		return nil, discovery.ErrClosed
	}
	r.regs[reg] = struct{}{}
	r.mu.Unlock()
	go reg.keepAlive(lease)
	return reg, nil
}

// Lookup implements discovery.Registry.
func (r *etcdRegistry) Lookup(ctx context.Context, name string) (discovery.Worker, error) {
	var w discovery.Worker
	err := retry.Retry(ctx, r.cfg.LookupTimeout, r.target, "lookup "+name, r.call(ctx, func(ctx context.Context) error {
		if r.isClosed() {
			return discovery.ErrClosed
		}
		resp, err := r.cli.Get(ctx, r.prefix+name)
		if err != nil {
			return err
		}
		if len(resp.Kvs) == 0 {
			return fmt.Errorf("%w: %q (etcd %s)", discovery.ErrNotFound, name, r.target)
		}
		return decodeWorker(resp.Kvs[0].Value, &w)
	}))
	return w, err
}

// List implements discovery.Registry.
func (r *etcdRegistry) List(ctx context.Context, role string) ([]discovery.Worker, error) {
	var out []discovery.Worker
	err := retry.Retry(ctx, r.cfg.LookupTimeout, r.target, "list", r.call(ctx, func(ctx context.Context) error {
		if r.isClosed() {
			return discovery.ErrClosed
		}
		resp, err := r.cli.Get(ctx, r.prefix, clientv3.WithPrefix())
		if err != nil {
			return err
		}
		out = out[:0]
		for _, kv := range resp.Kvs {
			var w discovery.Worker
			if err := decodeWorker(kv.Value, &w); err != nil {
				r.cfg.Logger.Warn("skipping a malformed worker entry", zap.ByteString("key", kv.Key), zap.Error(err))
				continue
			}
			if role == "" || w.Role == role {
				out = append(out, w)
			}
		}
		return nil
	}))
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, err
}

// Close implements discovery.Registry: withdraws every registration, then closes the client.
func (r *etcdRegistry) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	regs := r.regs
	r.regs = nil
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), attempt)
	defer cancel()
	var errs []error
	for reg := range regs {
		errs = append(errs, reg.withdraw(ctx))
	}
	errs = append(errs, r.cli.Close())
	return errors.Join(errs...)
}

func decodeWorker(b []byte, w *discovery.Worker) error {
	if err := json.Unmarshal(b, w); err != nil {
		return fmt.Errorf("kvxfer/discovery: malformed worker entry: %w", err)
	}
	return nil
}

// etcdRegistration keeps one worker's lease alive; when the lease is lost (etcd was away
// longer than the TTL), it publishes again under a new lease, with backoff, until withdrawn.
type etcdRegistration struct {
	r          *etcdRegistry
	w          discovery.Worker
	key, value string
	once       sync.Once
	stop, done chan struct{}
	mu         sync.Mutex
	lease      clientv3.LeaseID
}

// put grants a lease and writes the entry under it.
func (g *etcdRegistration) put(ctx context.Context) (clientv3.LeaseID, error) {
	l, err := g.r.cli.Grant(ctx, int64(g.r.cfg.TTL/time.Second))
	if err != nil {
		return 0, err
	}
	if _, err := g.r.cli.Put(ctx, g.key, g.value, clientv3.WithLease(l.ID)); err != nil {
		return 0, err
	}
	g.mu.Lock()
	g.lease = l.ID
	g.mu.Unlock()
	return l.ID, nil
}

func (g *etcdRegistration) keepAlive(lease clientv3.LeaseID) {
	defer close(g.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-g.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	wait := 50 * time.Millisecond
	for {
		ch, err := g.r.cli.KeepAlive(ctx, lease)
		if err == nil {
			for range ch { // drained until the lease is lost or ctx ends
			}
		}
		if ctx.Err() != nil {
			return
		}
		g.r.cfg.Logger.Warn("lease lost: publishing again", zap.String("worker", g.w.Name), zap.Error(err))
		for {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			wait = min(2*wait, g.r.cfg.TTL/2)
			actx, acancel := context.WithTimeout(ctx, attempt)
			l, err := g.put(actx)
			acancel()
			if err == nil {
				lease, wait = l, 50*time.Millisecond
				break
			}
		}
	}
}

// Withdraw implements discovery.Registration: revokes the lease, which deletes the entry (only this
// incarnation's: a newer one was written under another lease).
func (g *etcdRegistration) Withdraw(ctx context.Context) error {
	g.r.mu.Lock()
	delete(g.r.regs, g)
	g.r.mu.Unlock()
	return g.withdraw(ctx)
}

func (g *etcdRegistration) withdraw(ctx context.Context) error {
	var err error
	g.once.Do(func() {
		close(g.stop)
		<-g.done
		g.mu.Lock()
		lease := g.lease
		g.mu.Unlock()
		if _, rerr := g.r.cli.Revoke(ctx, lease); rerr != nil {
			err = fmt.Errorf("kvxfer/discovery: withdrawing %s: %w (its entry ends with the lease)", g.w.Name, rerr)
		}
	})
	return err
}

// abandon stops renewing without revoking, as a worker that dies does: the entry lasts until
// the lease runs out. Tests only.
func (g *etcdRegistration) abandon() {
	g.once.Do(func() {
		close(g.stop)
		<-g.done
	})
}
