// SPDX-License-Identifier: Apache-2.0

package etcd

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/discovery"
	"github.com/kvxfer/kvxfer/transfer/discovery/discoverytest"
	"github.com/kvxfer/kvxfer/transfer/discovery/internal/retry"
	"github.com/kvxfer/kvxfer/transfer/internal/stale"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// waitBound bounds every wait here.
const waitBound = 15 * time.Second

// testEtcd is a real etcd server in this process, on 127.0.0.1.
type testEtcd struct {
	*discoverytest.Etcd
	client url.URL
}

func freePort(t *testing.T) int { t.Helper(); return discoverytest.FreePort(t) }

func startEtcd(t *testing.T) *testEtcd {
	e := discoverytest.StartEtcd(t)
	return &testEtcd{Etcd: e, client: e.ClientURL}
}

func (s *testEtcd) target() string { return s.Target("kvxfer-test") }

// proxy forwards TCP from its own 127.0.0.1 port to to; cut closes the listener and every
// connection (the registry is unreachable: a cut link, not a slow shutdown), and restore
// listens again on the same port.
type proxy struct {
	t     *testing.T
	addr  string
	to    string
	mu    sync.Mutex
	ln    net.Listener
	conns []net.Conn
	wg    sync.WaitGroup
}

func newProxy(t *testing.T, to string) *proxy {
	p := &proxy{t: t, to: to, addr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	p.restore()
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) restore() {
	ln, err := net.Listen("tcp", p.addr)
	require.NoError(p.t, err)
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.to)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(u, c); u.Close() }()
			go func() { defer p.wg.Done(); _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
}

func (p *proxy) cut() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

func openEtcd(t *testing.T, s *testEtcd, cfg discovery.Config) discovery.Registry {
	t.Helper()
	r, err := discovery.Open(s.target(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// rawEtcd opens the backend itself, past discovery.Open's checks, for a test that needs its
// etcd client.
func rawEtcd(t *testing.T, s *testEtcd) *etcdRegistry {
	t.Helper()
	u, err := url.Parse(s.target())
	require.NoError(t, err)
	r, err := open(s.target(), u, discovery.Config{TTL: time.Second, LookupTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r.(*etcdRegistry)
}

func worker(name, role string, inc uint64) discovery.Worker {
	return discovery.Worker{Name: name, Role: role, Incarnation: inc, Address: []byte("ucx-" + name + fmt.Sprint(inc)),
		Endpoints: map[string]string{"control": "127.0.0.1:7400"}, Protocol: discovery.Protocol{Version: 1, Features: []string{"rma"}}}
}

func TestEtcd_PublishLookupList(t *testing.T) {
	s := startEtcd(t)
	r := openEtcd(t, s, discovery.Config{TTL: time.Second})
	ctx := t.Context()
	p0 := worker("prefill-0", "prefill", 1)
	_, err := r.Publish(ctx, p0)
	require.NoError(t, err)
	_, err = r.Publish(ctx, worker("decode-0", "decode", 2))
	require.NoError(t, err)

	got, err := r.Lookup(ctx, "prefill-0")
	require.NoError(t, err)
	require.Equal(t, p0, got)
	_, err = r.Lookup(ctx, "prefill-9")
	require.ErrorIs(t, err, discovery.ErrNotFound)

	ws, err := r.List(ctx, "decode")
	require.NoError(t, err)
	require.Len(t, ws, 1)
	require.Equal(t, "decode-0", ws[0].Name)
	ws, err = r.List(ctx, "")
	require.NoError(t, err)
	require.Len(t, ws, 2)

	bad := p0
	bad.Incarnation = 0
	_, err = r.Publish(ctx, bad)
	require.ErrorIs(t, err, discovery.ErrInvalid)
	bad = p0
	bad.Name = "a/b"
	_, err = r.Publish(ctx, bad)
	require.ErrorIs(t, err, discovery.ErrInvalid)
}

// A worker that dies (stops renewing without withdrawing) disappears within the TTL; one that
// withdraws disappears at once.
func TestEtcd_DeadWorkerExpires(t *testing.T) {
	s := startEtcd(t)
	const ttl = 2 * time.Second // renewed every TTL/3: room for a loaded host
	pub := openEtcd(t, s, discovery.Config{TTL: ttl})
	look := openEtcd(t, s, discovery.Config{TTL: ttl})
	ctx := t.Context()
	reg, err := pub.Publish(ctx, worker("prefill-0", "prefill", 7))
	require.NoError(t, err)

	// Alive for longer than its TTL: the lease is renewed.
	for start := time.Now(); time.Since(start) < 2*ttl; time.Sleep(100 * time.Millisecond) {
		_, err = look.Lookup(ctx, "prefill-0")
		require.NoError(t, err, "a live worker outlives its TTL")
	}

	died := time.Now()
	reg.(*etcdRegistration).abandon()
	require.Eventually(t, func() bool {
		_, err := look.Lookup(ctx, "prefill-0")
		return errors.Is(err, discovery.ErrNotFound)
	}, waitBound, 20*time.Millisecond)
	// etcd checks leases every 500ms: the entry is gone within the TTL and that check.
	require.Less(t, time.Since(died), ttl+3*time.Second, "a dead worker's entry ends with its lease")

	reg2, err := pub.Publish(ctx, worker("decode-0", "decode", 8))
	require.NoError(t, err)
	require.NoError(t, reg2.Withdraw(ctx))
	_, err = look.Lookup(ctx, "decode-0")
	require.ErrorIs(t, err, discovery.ErrNotFound, "withdrawn at once")
	require.NoError(t, reg2.Withdraw(ctx), "a second withdraw is harmless")
}

// A worker that restarts publishes a new incarnation under its name: lookups see it at once,
// params of the old life are stale, and the old lease running out does not remove the new
// entry.
func TestEtcd_RestartIsNewIncarnation(t *testing.T) {
	s := startEtcd(t)
	const ttl = time.Second
	old := openEtcd(t, s, discovery.Config{TTL: ttl})
	look := openEtcd(t, s, discovery.Config{TTL: ttl})
	ctx := t.Context()
	reg, err := old.Publish(ctx, worker("prefill-0", "prefill", 1))
	require.NoError(t, err)
	oldLease := reg.(*etcdRegistration).lease
	oldParams := &ucx.ContextParams{Incarnation: 1, WorkerAddress: reg.(*etcdRegistration).w.Address}
	require.NoError(t, discovery.CheckParams(ctx, look, "prefill-0", oldParams, nil))
	reg.(*etcdRegistration).abandon() // killed

	restarted := openEtcd(t, s, discovery.Config{TTL: ttl})
	_, err = restarted.Publish(ctx, worker("prefill-0", "prefill", 2))
	require.NoError(t, err)
	got, err := look.Lookup(ctx, "prefill-0")
	require.NoError(t, err)
	require.Equal(t, uint64(2), got.Incarnation)

	err = discovery.CheckParams(ctx, look, "prefill-0", oldParams, nil)
	require.ErrorIs(t, err, ucx.ErrStaleIncarnation)
	var se *stale.Error
	require.ErrorAs(t, err, &se)
	require.Equal(t, uint64(1), se.Have)
	require.Equal(t, uint64(2), se.Current)

	// The old lease runs out; the new entry stays.
	raw := rawEtcd(t, s)
	require.Eventually(t, func() bool {
		ttlResp, err := raw.cli.TimeToLive(ctx, oldLease)
		return err == nil && ttlResp.TTL == -1
	}, waitBound, 50*time.Millisecond)
	got, err = look.Lookup(ctx, "prefill-0")
	require.NoError(t, err)
	require.Equal(t, uint64(2), got.Incarnation)

	// And once the new life dies too, its params are stale as well: the worker is gone.
	newParams := &ucx.ContextParams{Incarnation: 2, WorkerAddress: got.Address}
	require.NoError(t, discovery.CheckParams(ctx, look, "prefill-0", newParams, nil))
	require.NoError(t, restarted.Close())
	err = discovery.CheckParams(ctx, look, "prefill-0", newParams, nil)
	require.ErrorIs(t, err, ucx.ErrStaleIncarnation)
}

// etcd going away: lookups fail with discovery.ErrUnavailable after bounded retries, a transfer already
// under way completes regardless, and once etcd is back the publisher's entry is there again.
func TestEtcd_Unreachable(t *testing.T) {
	s := startEtcd(t)
	px := newProxy(t, s.client.Host)
	target := "etcd://" + px.addr + "/kvxfer-test"
	const ttl = time.Second
	const bound = 300 * time.Millisecond
	open := func(cfg discovery.Config) discovery.Registry {
		r, err := discovery.Open(target, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	pub := open(discovery.Config{TTL: ttl})
	look := open(discovery.Config{TTL: ttl, LookupTimeout: bound})
	ctx := t.Context()
	_, err := pub.Publish(ctx, worker("prefill-0", "prefill", 3))
	require.NoError(t, err)
	_, err = look.Lookup(ctx, "prefill-0")
	require.NoError(t, err)

	// A transfer under way: decode's Receive is posted and waiting for the sender.
	l := layout.Packed(layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 2, HeadDim: 16, ElemSize: 2, TokensPerBlock: 4, NumBlocks: 4}, layout.BlockMajor)
	mem := mem.NewNetwork()
	prefill, err := transfer.New(mem.Transport("prefill-0"), transfer.Config{})
	require.NoError(t, err)
	defer prefill.Close()
	decode, err := transfer.New(mem.Transport("decode-0"), transfer.Config{})
	require.NoError(t, err)
	defer decode.Close()
	src, dst := make([]byte, l.SpanBytes()), make([]byte, l.SpanBytes())
	for i := range src {
		src[i] = byte(i*31 + 7)
	}
	plan, err := layout.NewPlan(l, l.All(), []int32{0, 1, 2, 3})
	require.NoError(t, err)
	recv, err := decode.Receive(ctx, transfer.Spec{ID: 1, Peer: "prefill-0", Plan: plan, Pool: dst, Timeout: waitBound})
	require.NoError(t, err)
	defer recv.Release()

	px.cut()
	start := time.Now()
	_, err = look.Lookup(ctx, "prefill-0")
	require.ErrorIs(t, err, discovery.ErrUnavailable)
	var ue *retry.UnavailableError
	require.ErrorAs(t, err, &ue)
	require.Greater(t, ue.Attempts, 1, "retried")
	require.Less(t, time.Since(start), bound+2*attempt, "bounded")
	_, err = look.List(ctx, "")
	require.ErrorIs(t, err, discovery.ErrUnavailable)

	send, err := prefill.Send(ctx, transfer.Spec{ID: 1, Peer: "decode-0", Plan: plan, Pool: src})
	require.NoError(t, err)
	defer send.Release()
	select {
	case <-recv.Quiesced():
	case <-time.After(waitBound):
		t.Fatal("the transfer did not end")
	}
	t.Logf("lookups failed in %v; transfer done", time.Since(start))
	require.Equal(t, transfer.Completed, recv.Status().State)
	require.True(t, bytes.Equal(src, dst), "every byte arrived")

	// The lease runs out while etcd is unreachable: the entry is gone for good...
	require.Eventually(t, func() bool {
		direct := openEtcd(t, s, discovery.Config{TTL: ttl, LookupTimeout: bound})
		_, err := direct.Lookup(ctx, "prefill-0")
		_ = direct.Close()
		return errors.Is(err, discovery.ErrNotFound)
	}, waitBound, 100*time.Millisecond)
	// ...until etcd is reachable again: the publisher publishes again, under a new lease,
	// without being asked.
	px.restore()
	require.Eventually(t, func() bool {
		w, err := look.Lookup(ctx, "prefill-0")
		return err == nil && w.Incarnation == 3
	}, waitBound, 50*time.Millisecond)
}
