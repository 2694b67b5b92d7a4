// SPDX-License-Identifier: Apache-2.0

//go:build linux && cgo

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/discovery"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
	"github.com/kvxfer/kvxfer/transfer/tuning"
)

// cutLayout is a 64 MiB pool moved whole: long enough over a rate-limited link to cut it
// mid-transfer.
var cutLayout = layout.Packed(layout.Dims{NumLayers: 8, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2,
	TokensPerBlock: 16, NumBlocks: 64}, layout.BlockMajor)

// workerChild runs one engine over UCX TCP on dev, publishes itself in the registry at
// target, finds its peer there, moves request 1 (prefill sends, decode receives), and prints
// "STATUS state bytes healthy live" every 50ms until its stdin closes.
func workerChild(spec string) int {
	f := strings.Split(spec, ",")
	if len(f) != 3 {
		fmt.Fprintln(os.Stderr, "worker child: bad spec", spec)
		return 2
	}
	role, target, dev := f[0], f[1], f[2]
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "worker child:", role+":", err); return 1 }
	tr, err := ucx.New(ucx.Config{TLS: "tcp,self", NetDevices: dev, StagingBytes: 4 << 20,
		KeepaliveInterval: 200 * time.Millisecond})
	if err != nil {
		return fail(err)
	}
	eng, err := transfer.New(tr, transfer.Config{
		SlotBytes:        1 << 20,
		MaxConcurrent:    1,
		StagingMemory:    tr.StagingMemory(),
		ProgressDeadline: time.Second,
		TransferTimeout:  4 * time.Second,
		QueueTimeout:     30 * time.Second,
		Tuning:           tuning.Config{DisableDirect: true, QuarantineTimeout: 4 * time.Second},
	})
	if err != nil {
		_ = tr.Close(true)
		return fail(err)
	}
	defer eng.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	reg, err := discovery.Open(target, discovery.Config{TTL: 2 * time.Second, LookupTimeout: 2 * time.Second})
	if err != nil {
		return fail(err)
	}
	defer reg.Close()
	if _, err := reg.Publish(ctx, discovery.Worker{Name: role, Role: role, Incarnation: tr.Incarnation(), Address: tr.WorkerAddress()}); err != nil {
		return fail(err)
	}
	other := map[string]string{"prefill": "decode", "decode": "prefill"}[role]
	var peer discovery.Worker
	for {
		if peer, err = reg.Lookup(ctx, other); err == nil {
			break
		}
		if !errors.Is(err, discovery.ErrNotFound) || ctx.Err() != nil {
			return fail(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	pool := make([]byte, cutLayout.SpanBytes())
	blocks := make([]int32, cutLayout.NumBlocks)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	plan, err := layout.NewPlan(cutLayout, cutLayout.All(), blocks)
	if err != nil {
		return fail(err)
	}
	spec2 := transfer.Spec{ID: 1, Peer: ucx.PeerFromAddress(peer.Address), Plan: plan, Pool: pool}
	var h *transfer.Handle
	if role == "prefill" {
		h, err = eng.Send(ctx, spec2)
	} else {
		h, err = eng.Receive(ctx, spec2)
	}
	if err != nil {
		return fail(err)
	}
	defer h.Release()
	stop := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		st, hl := h.Status(), eng.Health()
		fmt.Printf("STATUS %s %d %t %t\n", st.State, st.Bytes, hl.Healthy, !hl.Numbers.Closed && !hl.Numbers.TransportWedged && !hl.Numbers.MoverWedged) // live: /livez's rule (observe)
		select {
		case <-stop:
			return 0
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-t.C:
		}
	}
}

// workerStatus is one STATUS line.
type workerStatus struct {
	state         string
	bytes         int64
	healthy, live bool
}

// watchWorker parses a worker's STATUS lines onto a channel.
func watchWorker(r io.Reader) <-chan workerStatus {
	ch := make(chan workerStatus, 1024)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			var s workerStatus
			if _, err := fmt.Sscanf(sc.Text(), "STATUS %s %d %t %t", &s.state, &s.bytes, &s.healthy, &s.live); err == nil {
				select {
				case ch <- s:
				default: // the test reads as it goes; a full channel only drops old lines
				}
			}
		}
	}()
	return ch
}

// Two "hosts" in two network namespaces, found through etcd, with a transfer under way over
// UCX TCP on a rate-limited link; the link is cut: both sides' handles end within their
// deadlines, readiness turns false (no progress), and liveness stays true (a restart would
// not mend a cut link).
func TestDisagg_LinkCutBetweenNamespaces(t *testing.T) {
	skipWithoutUCX(t)
	n := newNSPair(t)
	// 40 Mbit/s: the 64 MiB request takes about 13 s, so the cut lands mid-transfer.
	if out, err := exec.Command("tc", "-n", n.a, "qdisc", "add", "dev", n.devA, "root", "tbf", "rate", "40mbit",
		"burst", "32kbit", "latency", "400ms").CombinedOutput(); err != nil {
		t.Skipf("cannot rate-limit the link (tc tbf): %v: %s", err, out)
	}
	target := startEtcdIn(t, n)

	start := func(role, ns, dev string) (<-chan workerStatus, *syncBuffer) {
		var stderr syncBuffer
		var out io.ReadCloser
		var in io.WriteCloser
		inNS(t, ns, []string{envWorkerChild + "=" + role + "," + target + "," + dev}, func(c *exec.Cmd) {
			var err error
			out, err = c.StdoutPipe()
			require.NoError(t, err)
			in, err = c.StdinPipe()
			require.NoError(t, err)
			c.Stderr = &stderr
		})
		t.Cleanup(func() { _ = in.Close() })
		return watchWorker(out), &stderr
	}
	prefill, prefillErr := start("prefill", n.a, n.devA)
	decode, decodeErr := start("decode", n.b, n.devB)

	// Wait for the transfer to be under way: decode has received some bytes.
	next := func(name string, ch <-chan workerStatus, stderr *syncBuffer, bound time.Duration) workerStatus {
		select {
		case s, ok := <-ch:
			require.True(t, ok, "%s exited: %s", name, stderr.String())
			return s
		case <-time.After(bound):
			t.Fatalf("%s said nothing within %v: %s", name, bound, stderr.String())
			return workerStatus{}
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		s := next("decode", decode, decodeErr, 10*time.Second)
		require.True(t, s.live)
		if s.bytes > 0 && s.state == "in-flight" {
			break
		}
		require.True(t, time.Now().Before(deadline), "the transfer never got under way: %+v", s)
	}
	ipCmd(t, "-n", n.a, "link", "set", n.devA, "down")
	cut := time.Now()

	// Within the transfer deadline (4s) plus the quarantine bound (4s) and slack, each side's
	// handle is no longer in flight, its engine not ready, and live throughout.
	check := func(name string, ch <-chan workerStatus, stderr *syncBuffer) {
		ended, unready := false, false
		for !(ended && unready) {
			s := next(name, ch, stderr, 10*time.Second)
			require.True(t, s.live, "%s: liveness stays true after the cut: %+v", name, s)
			ended = ended || (s.state != "in-flight" && s.state != "advertised" && s.state != "queued")
			unready = unready || !s.healthy
			require.Less(t, time.Since(cut), 15*time.Second, "%s after the cut: ended %t, unready %t, last %+v", name, ended, unready, s)
		}
		t.Logf("%s: handle ended and engine not ready %v after the cut, live throughout", name, time.Since(cut).Round(time.Millisecond))
	}
	check("decode", decode, decodeErr)
	check("prefill", prefill, prefillErr)
}

// startEtcdIn starts etcd in namespace n.a on 10.213.9.1 and returns its discovery target.
func startEtcdIn(t *testing.T, n *nsPair) string {
	var etcdErr syncBuffer
	var etcdOut io.ReadCloser
	var etcdStdin io.WriteCloser
	inNS(t, n.a, []string{envEtcdChild + "=10.213.9.1:23790,10.213.9.1:23800," + t.TempDir()}, func(c *exec.Cmd) {
		var err error
		etcdOut, err = c.StdoutPipe()
		require.NoError(t, err)
		etcdStdin, err = c.StdinPipe()
		require.NoError(t, err)
		c.Stderr = &etcdErr
	})
	t.Cleanup(func() { _ = etcdStdin.Close() })
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(etcdOut).ReadString('\n')
		if err == nil && line != "etcd ready\n" {
			err = fmt.Errorf("etcd child said %q", line)
		}
		ready <- err
	}()
	select {
	case err := <-ready:
		require.NoError(t, err, "etcd: %s", etcdErr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("etcd did not start in the namespace: %s", etcdErr.String())
	}
	return "etcd://10.213.9.1:23790/disagg"
}
