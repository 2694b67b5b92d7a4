// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package stress

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// netPair is two network namespaces joined by a veth pair, made by the soak for itself: the
// private addresses live only inside the namespaces, and nothing else is touched.
type netPair struct {
	nsA, nsB, devA, devB string
}

const netA, netB = "10.213.7.1/30", "10.213.7.2/30"

func runIP(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// removeStaleNamespaces deletes the namespaces of earlier soaks whose process is gone (one
// killed with SIGKILL cannot clean up after itself). Only names this package makes are touched.
func removeStaleNamespaces() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		name := f[0]
		digits, ok := strings.CutPrefix(name, "kvxs")
		if !ok || len(digits) < 2 || (!strings.HasSuffix(digits, "a") && !strings.HasSuffix(digits, "b")) {
			continue
		}
		pid, err := strconv.Atoi(digits[:len(digits)-1])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			_ = runIP("ip", "netns", "del", name)
		}
	}
}

// newNetPair makes the namespaces and the link; on any failure it removes what it made.
func newNetPair() (*netPair, error) {
	removeStaleNamespaces()
	id := strconv.Itoa(os.Getpid())
	n := &netPair{nsA: "kvxs" + id + "a", nsB: "kvxs" + id + "b", devA: "kvxs" + id + "a0", devB: "kvxs" + id + "b0"}
	steps := [][]string{
		{"ip", "netns", "add", n.nsA},
		{"ip", "netns", "add", n.nsB},
		{"ip", "link", "add", n.devA, "type", "veth", "peer", "name", n.devB},
		{"ip", "link", "set", n.devA, "netns", n.nsA},
		{"ip", "link", "set", n.devB, "netns", n.nsB},
		{"ip", "-n", n.nsA, "addr", "add", netA, "dev", n.devA},
		{"ip", "-n", n.nsB, "addr", "add", netB, "dev", n.devB},
		{"ip", "-n", n.nsA, "link", "set", "lo", "up"},
		{"ip", "-n", n.nsB, "link", "set", "lo", "up"},
		{"ip", "-n", n.nsA, "link", "set", n.devA, "up"},
		{"ip", "-n", n.nsB, "link", "set", n.devB, "up"},
	}
	for _, s := range steps {
		if err := runIP(s...); err != nil {
			n.remove()
			return nil, err
		}
	}
	if err := n.awaitCarrier(5 * time.Second); err != nil {
		n.remove()
		return nil, err
	}
	return n, nil
}

// awaitCarrier waits, bounded, until both ends of the veth pair have their carrier
// (LOWER_UP). `ip link set up` returns before it comes, and UCX's TCP transport takes only
// running interfaces: a peer started too soon fails with "No such device" (seen once in a
// 60 s soak).
func (n *netPair) awaitCarrier(within time.Duration) error {
	deadline := time.Now().Add(within)
	for _, end := range [][2]string{{n.nsA, n.devA}, {n.nsB, n.devB}} {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			out, err := exec.CommandContext(ctx, "ip", "-n", end[0], "-o", "link", "show", "dev", end[1]).Output()
			cancel()
			if err == nil && strings.Contains(string(out), "LOWER_UP") {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s in %s has no carrier %v after it was set up: %q", end[1], end[0], within, strings.TrimSpace(string(out)))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// remove deletes both namespaces (the veth pair goes with them); it is safe to call twice.
func (n *netPair) remove() {
	_ = runIP("ip", "netns", "del", n.nsA)
	_ = runIP("ip", "netns", "del", n.nsB)
	_ = runIP("ip", "link", "del", n.devA) // only if it never left the root namespace
}

func (n *netPair) cut() error     { return runIP("ip", "-n", n.nsA, "link", "set", n.devA, "down") }
func (n *netPair) restore() error { return runIP("ip", "-n", n.nsA, "link", "set", n.devA, "up") }

// lossTable is the nftables table the lossy link's drop rules live in, in each namespace.
const lossTable = "kvxsoak"

// lossyCommands are the commands that make the link lossy: in each namespace an nftables rule
// drops pct% of the outgoing packets at random (numgen random), and a tbf qdisc limits the
// prefill side's rate to 1 Gbit/s. netem would do both, but many kernels (this one) lack
// sch_netem; nf_tables and sch_tbf are in every distribution kernel.
func (n *netPair) lossyCommands(pct int) [][]string {
	var cmds [][]string
	for _, ns := range []string{n.nsA, n.nsB} {
		nft := []string{"ip", "netns", "exec", ns, "nft"}
		cmds = append(cmds,
			append(slices.Clone(nft), "add", "table", "inet", lossTable),
			append(slices.Clone(nft), "add", "chain", "inet", lossTable, "out", "{ type filter hook output priority 0 ; }"),
			append(slices.Clone(nft), "add", "rule", "inet", lossTable, "out", "numgen", "random", "mod", "100", "<", strconv.Itoa(pct), "drop"))
	}
	return append(cmds, []string{"tc", "-n", n.nsA, "qdisc", "add", "dev", n.devA, "root", "tbf", "rate", "1gbit", "burst", "256kb", "latency", "50ms"})
}

// clearLossCommands undo lossyCommands.
func (n *netPair) clearLossCommands() [][]string {
	return [][]string{
		{"ip", "netns", "exec", n.nsA, "nft", "delete", "table", "inet", lossTable},
		{"ip", "netns", "exec", n.nsB, "nft", "delete", "table", "inet", lossTable},
		{"tc", "-n", n.nsA, "qdisc", "del", "dev", n.devA, "root"},
	}
}

// lossy makes the link drop pct% of the packets each way and limits its rate; on a failure
// it undoes what it did.
func (n *netPair) lossy(pct int) error {
	for _, c := range n.lossyCommands(pct) {
		if err := runIP(c...); err != nil {
			_ = n.clearLoss()
			return err
		}
	}
	return nil
}

// clearLoss undoes lossy, every step tried; the first error is returned.
func (n *netPair) clearLoss() error {
	var first error
	for _, c := range n.clearLossCommands() {
		if err := runIP(c...); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// lossyUnavailable says why this machine cannot make the link lossy ("" when it can): the
// nft or tc command missing (scripts/deps.sh installs nftables and iproute2).
func lossyUnavailable() string {
	for _, cmd := range []string{"nft", "tc"} {
		if _, err := exec.LookPath(cmd); err != nil {
			return fmt.Sprintf("%s not found (Debian packages nftables and iproute2; scripts/deps.sh installs them)", cmd)
		}
	}
	return ""
}

// nsPeer is a peer process inside a namespace, with the replies the partition phase waits on.
type nsPeer struct {
	lastCompleted atomic.Int64 // unix nanoseconds of its last END completed
	*procPeer
	health chan string
	mu     sync.Mutex
	ends   map[uint64]chan string
}

// startNSPeer starts a peer process inside namespace ns, bound to dev, over UCX TCP.
func (ps *procSoak) startNSPeer(idx int, ns, dev string) (*nsPeer, error) {
	pc := ps.pc
	pc.TLS, pc.NetDevices = "tcp", dev
	pc.Windows = 0 // the partition's requests use Go memory
	p := &nsPeer{procPeer: &procPeer{idx: idx, pool: make(chan string, 1)},
		health: make(chan string, 1), ends: map[uint64]chan string{}}
	addr := make(chan string, 1)
	cmd := exec.Command("ip", "netns", "exec", ns, ps.exe) // ip execs the peer: same pid
	var err error
	p.child, err = spawnPeer(cmd, pc, func(line string) {
		f := strings.Fields(line)
		switch {
		case len(f) >= 1 && f[0] == "HEALTH":
			select {
			case p.health <- line:
			default:
			}
		case len(f) >= 3 && f[0] == "END":
			id, _ := strconv.ParseUint(f[1], 10, 64)
			if f[2] == "completed" {
				p.lastCompleted.Store(time.Now().UnixNano())
			}
			p.mu.Lock()
			ch := p.ends[id]
			delete(p.ends, id)
			p.mu.Unlock()
			if ch != nil {
				ch <- line
			}
		default:
			ps.peerLine(p.procPeer, line, addr)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("stress: starting a peer in %s: %w", ns, err)
	}
	if err := awaitAddr(p.procPeer, addr, "the peer in "+ns); err != nil {
		return nil, err
	}
	return p, nil
}

// expectEnd registers a waiter for request id's END line.
func (p *nsPeer) expectEnd(id uint64) chan string {
	ch := make(chan string, 1)
	p.mu.Lock()
	p.ends[id] = ch
	p.mu.Unlock()
	return ch
}

// healthy asks the peer for its engine's health; ok is false if it did not answer in time.
func (p *nsPeer) healthy() (healthy, ok bool) {
	healthy, _, ok = p.healthReason()
	return healthy, ok
}

// healthReason is healthy with the reason the peer gave (spaces as underscores).
func (p *nsPeer) healthReason() (healthy bool, reason string, ok bool) {
	select { // drop a stale answer
	case <-p.health:
	default:
	}
	if p.send("HEALTH") != nil {
		return false, "", false
	}
	select {
	case line := <-p.health:
		f := strings.Fields(line)
		if len(f) >= 3 {
			reason = f[2]
		}
		return strings.HasPrefix(line, "HEALTH 1"), reason, true
	case <-time.After(2 * time.Second):
		return false, "", false
	}
}

// partition is the network phase of the process soak: a prefill peer in one namespace sends
// to a decode peer in another over UCX TCP across a veth pair; the link is cut for FreezeFor
// (decode must turn unhealthy within the progress deadline, and healthy within RecoveryBound
// of the restore), then made lossy (LossPercent% of the packets dropped each way, 1 Gbit/s) for
// a fifth of the phase, while requests keep flowing: each must complete byte-exact or fail
// with a typed error, health must not call the link stalled while transfers complete over it,
// and decode must be healthy within RecoveryBound once it is clean again. Where the machine
// refuses network namespaces, the phase is skipped, loudly.
func (ps *procSoak) partition(ctx context.Context, d time.Duration) {
	net, err := newNetPair()
	if err != nil {
		msg := fmt.Sprintf("partition skipped: this machine does not allow network namespaces (needs CAP_NET_ADMIN): %v", err)
		fmt.Fprintln(os.Stderr, "kvxbench stress: WARNING: "+msg)
		ps.skip(msg)
		return
	}
	defer net.remove()
	prefill, err := ps.startNSPeer(10, net.nsA, net.devA)
	if err != nil {
		ps.addBreach(err.Error())
		return
	}
	decode, err := ps.startNSPeer(11, net.nsB, net.devB)
	if err != nil {
		ps.addBreach(err.Error())
		ps.stopNSPeers(prefill)
		return
	}
	defer ps.stopNSPeers(prefill, decode)
	for _, pair := range [][2]*nsPeer{{prefill, decode}, {decode, prefill}} {
		if err := pair[0].send("PEER " + string(pair[1].name)); err != nil {
			ps.addBreach(fmt.Sprintf("partition: telling a peer its partner: %v", err))
			return
		}
	}

	trafficCtx, stop := context.WithTimeout(ctx, d)
	defer stop()
	var workers sync.WaitGroup
	for w := range 16 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			r := rand.New(rand.NewPCG(ps.cfg.Seed+1, uint64(w)))
			for trafficCtx.Err() == nil {
				ps.nsRequest(r, prefill, decode)
			}
		}()
	}
	start := time.Now()
	if sleepUntil(trafficCtx, start.Add(d/5)) {
		ps.injected[FaultPartition].Add(1)
		t0 := time.Now()
		if err := net.cut(); err != nil {
			ps.addBreach(fmt.Sprintf("partition: cutting the link: %v", err))
		} else {
			ps.log.Info("link cut", zap.String("dev", net.devA))
			ps.awaitPeerHealth(decode, false, t0, ps.cfg.ProgressDeadline+ps.cfg.Grace, "the link cut")
			time.Sleep(time.Until(t0.Add(ps.cfg.FreezeFor)))
			t1 := time.Now()
			if err := net.restore(); err != nil {
				ps.addBreach(fmt.Sprintf("partition: restoring the link: %v", err))
			}
			ps.log.Info("link restored", zap.String("dev", net.devA))
			ps.awaitPeerHealth(decode, true, t1, ps.cfg.RecoveryBound, "the link restore")
		}
	}
	if sleepUntil(trafficCtx, start.Add(d*3/5)) {
		ps.lossyLink(trafficCtx, net, decode, d/5)
	}
	<-trafficCtx.Done()
	bound := ps.quiesceBound(ps.cfg.TransferTimeout) + ps.cfg.Grace
	if !waitBounded(&workers, closedChan(), bound) {
		ps.addBreach(fmt.Sprintf("partition: requests still waiting %v after the traffic stopped", bound))
	}
}

// lossyLink makes the link lossy for d, checks health while it is, and waits for decode's
// recovery once it is clean again.
func (ps *procSoak) lossyLink(ctx context.Context, net *netPair, decode *nsPeer, d time.Duration) {
	if why := lossyUnavailable(); why != "" {
		msg := "lossy link skipped: " + why
		fmt.Fprintln(os.Stderr, "kvxbench stress: WARNING: "+msg)
		ps.skip(msg)
		return
	}
	if err := net.lossy(ps.cfg.LossPercent); err != nil {
		msg := fmt.Sprintf("lossy link skipped: nftables or tbf refused in the namespace (nf_tables, sch_tbf): %v", err)
		fmt.Fprintln(os.Stderr, "kvxbench stress: WARNING: "+msg)
		ps.skip(msg)
		return
	}
	ps.injected[FaultPartition].Add(1)
	ps.log.Info("link lossy", zap.String("dev", net.devA), zap.Int("loss_percent", ps.cfg.LossPercent))
	t0 := time.Now()
	completedBefore := ps.completed.Load()
	for sleepUntil(ctx, time.Now().Add(250*time.Millisecond)) && time.Since(t0) < d {
		asked := time.Now()
		healthy, reason, ok := decode.healthReason()
		last := time.Unix(0, decode.lastCompleted.Load())
		// A transfer completed less than half a progress deadline before the question: an
		// engine that then says nothing progressed for a whole deadline is not telling the
		// truth (its other reasons, such as poisoned slots, may be).
		if ok && !healthy && strings.Contains(reason, "no_transfer_progressed") && asked.Sub(last) < ps.cfg.ProgressDeadline/2 {
			ps.addBreach(fmt.Sprintf("lossy link: the decode peer reported %q %v after a transfer completed over the link",
				strings.ReplaceAll(reason, "_", " "), asked.Sub(last).Round(time.Millisecond)))
		}
	}
	if err := net.clearLoss(); err != nil {
		ps.addBreach(fmt.Sprintf("partition: clearing the lossy link: %v", err))
	}
	ps.log.Info("link clean", zap.Int64("completed_while_lossy", ps.completed.Load()-completedBefore))
	if ps.completed.Load() == completedBefore {
		ps.addBreach(fmt.Sprintf("lossy link: nothing completed in %v at %d%% loss: TCP retransmits, so transfers must still move",
			time.Since(t0).Round(time.Millisecond), ps.cfg.LossPercent))
	}
	ps.awaitPeerHealth(decode, true, time.Now(), ps.cfg.RecoveryBound, "the lossy link cleaned")
}

// awaitPeerHealth polls a peer's health until it is want, bounded by within after since.
func (ps *procSoak) awaitPeerHealth(p *nsPeer, want bool, since time.Time, within time.Duration, what string) {
	for time.Since(since) < within {
		if h, ok := p.healthy(); ok && h == want {
			if want {
				storeMax(&ps.longestRecovery, time.Since(since))
			} else {
				storeMax(&ps.longestDetect, time.Since(since))
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	state := "unhealthy"
	if want {
		state = "healthy"
	}
	ps.addBreach(fmt.Sprintf("partition: the decode peer was not %s within %v of %s", state, within, what))
}

// nsRequest moves one request from the prefill peer to the decode peer, which checks it.
func (ps *procSoak) nsRequest(r *rand.Rand, prefill, decode *nsPeer) {
	cfg := ps.cfg
	id := ps.lastRequest.Add(1)
	payload := cfg.SlotBytes - 64
	blockBytes := kvLayout(kvHeads, 1).BlockBytes()
	nb := 1 + r.Int64N(max(1, payload/blockBytes-1))
	if r.Float64() < cfg.LargeFraction {
		nb = payload/blockBytes + 1 + r.Int64N(6)
	}
	src, dst := blocksString(randomBlocks(r, nb, nb+2)), blocksString(randomBlocks(r, nb, nb+2))
	ms := cfg.TransferTimeout.Milliseconds()
	end := decode.expectEnd(id)
	started := time.Now()
	if decode.send(fmt.Sprintf("RECV %d %d %d %d %d %s %s", id, kvHeads, nb, id, ms, src, dst)) != nil ||
		prefill.send(fmt.Sprintf("SEND %d %d %d %d %d %s", id, kvHeads, nb, id, ms, src)) != nil {
		ps.addBreach(fmt.Sprintf("partition: request %d: a peer's input is closed", id))
		time.Sleep(10 * time.Millisecond)
		return
	}
	ps.started.Add(1)
	bound := ps.quiesceBound(cfg.TransferTimeout) + cfg.Grace
	select {
	case line := <-end:
		f := strings.Fields(line)
		switch {
		case len(f) >= 4 && f[3] == "corrupt":
			ps.corrupt.Add(1)
			ps.addBreach(fmt.Sprintf("partition: request %d completed corrupt", id))
		case f[2] == "completed":
			ps.completed.Add(1)
		case f[2] == "failed":
			ps.failed.Add(1)
			if len(f) >= 5 && f[4] == untypedError {
				ps.addBreach(fmt.Sprintf("partition: request %d failed with an error that matches no kvxfer sentinel", id))
			}
		case f[2] == "cancelled":
			ps.cancelled.Add(1)
		}
	case <-time.After(time.Until(started.Add(bound))):
		ps.wedged.Add(1)
		ps.addBreach(fmt.Sprintf("partition: request %d: no END from the decode peer within %v", id, bound))
	}
}

func blocksString(ids []int32) string {
	s := make([]string, len(ids))
	for i, b := range ids {
		s[i] = strconv.Itoa(int(b))
	}
	return strings.Join(s, ",")
}

// stopNSPeers ends namespace peers as stopPeers ends the others.
func (ps *procSoak) stopNSPeers(peers ...*nsPeer) {
	var pp []*procPeer
	for _, p := range peers {
		pp = append(pp, p.procPeer)
	}
	ps.stopThese(pp)
}
