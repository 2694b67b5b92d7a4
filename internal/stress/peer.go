// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package stress

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// PeerEnv names the environment variable that turns a soak binary into a prefill peer
// process of a --processes soak; its value is the peer's configuration as JSON. Binaries that
// run the soak call RunPeerFromEnv first thing in main (tests, in TestMain).
const PeerEnv = "KVXSTRESS_PEER"

// peerConfig is what a parent hands its peer process.
type peerConfig struct {
	TLS               string        `json:"tls"`
	NetDevices        string        `json:"net_devices"`
	SlotBytes         int64         `json:"slot_bytes"`
	MaxConcurrent     int           `json:"max_concurrent"`
	NumSlots          int           `json:"num_slots"`
	QueueTimeout      time.Duration `json:"queue_timeout"`
	ProgressDeadline  time.Duration `json:"progress_deadline"`
	QuarantineTimeout time.Duration `json:"quarantine_timeout"`
	Grace             time.Duration `json:"grace"`
	// Stopped is the longest the parent may stop this process (SIGSTOP): its clocks run on
	// while it cannot act, so every bound it checks on itself stretches by this much.
	Stopped  time.Duration `json:"stopped"`
	Lifetime time.Duration `json:"lifetime"` // the peer exits by itself after this
}

// RunPeerFromEnv runs the peer process when PeerEnv is set and returns its exit code and
// true; otherwise it returns false at once.
func RunPeerFromEnv() (int, bool) {
	v := os.Getenv(PeerEnv)
	if v == "" {
		return 0, false
	}
	var pc peerConfig
	if err := json.Unmarshal([]byte(v), &pc); err != nil {
		fmt.Fprintf(os.Stderr, "stress peer: bad %s: %v\n", PeerEnv, err)
		return 2, true
	}
	if err := runPeer(pc, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "stress peer: %v\n", err)
		fmt.Printf("ERR %v\n", err)
		return 1, true
	}
	return 0, true
}

// seededPool is the sender's KV pool of a request in process mode: both processes build it
// from the same seed, so the receiver knows the checksum without being sent it.
func seededPool(heads, nb int64, seed uint64, blocks []int32) (*layout.Plan, []byte) {
	l := kvLayout(heads, nb+2)
	p, err := layout.NewPlan(l, l.All(), blocks)
	must(err)
	pool := make([]byte, l.SpanBytes())
	var key [32]byte
	for i := range 8 {
		key[i] = byte(seed >> (8 * i))
	}
	seedFill(key, pool)
	return p, pool
}

// runPeer is the prefill peer process. Protocol, one line at a time on stdin/stdout:
//
//	peer: ADDR <hex>                          its worker address
//	parent: PEER <hex>                        the other engine's
//	parent: SEND <id> <heads> <nb> <seed> <timeout-ms> <b1,b2,...>
//	parent: RECV <id> <heads> <nb> <seed> <timeout-ms> <src b1,...> <dst b1,...>
//	                                          receive, and check against the seeded source
//	parent: HEALTH                            peer: HEALTH <1|0> <reason>
//	parent: CANCEL <id>
//	peer: END <id> <state> [ok|corrupt]       a send or receive quiesced
//	peer: WEDGED <id> <what>                  a send missed its bound
//	parent: closes stdin                      the peer drains and prints
//	peer: POOL <total> <free> <poisoned> <observed-poisoned> <reused>
func runPeer(pc peerConfig, stdin io.Reader, stdout io.Writer) error {
	var outMu sync.Mutex
	say := func(format string, a ...any) {
		outMu.Lock()
		fmt.Fprintf(stdout, format+"\n", a...)
		outMu.Unlock()
	}
	tr, err := ucx.New(ucx.Config{TLS: pc.TLS, NetDevices: pc.NetDevices, KeepaliveInterval: 200 * time.Millisecond,
		StagingBytes: int64(pc.NumSlots) * pc.SlotBytes, CloseTimeout: 2 * time.Second})
	if err != nil {
		return err
	}
	n := &node{name: tr.Self()}
	n.slot = newSlotTracker(tr, tr.StagingMemory(), pc.SlotBytes)
	eng, err := transfer.New(n.slot, transfer.Config{SlotBytes: pc.SlotBytes, MaxConcurrent: pc.MaxConcurrent,
		NumSlots: pc.NumSlots, StagingMemory: tr.StagingMemory(), QueueTimeout: pc.QueueTimeout,
		ProgressDeadline: pc.ProgressDeadline, QuarantineTimeout: pc.QuarantineTimeout,
		CloseTimeout: pc.QuarantineTimeout + pc.Grace, Observer: n})
	if err != nil {
		_ = tr.Close(true)
		return err
	}
	n.eng = eng
	say("ADDR %s", hex.EncodeToString(tr.WorkerAddress()))

	// The parent closing stdin ends the peer; so does its lifetime running out.
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdin)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	life := time.NewTimer(pc.Lifetime)
	defer life.Stop()
	var decode transfer.Peer
	var sends sync.WaitGroup
loop:
	for {
		var line string
		var ok bool
		select {
		case line, ok = <-lines:
		case <-life.C:
			break loop
		}
		if !ok {
			break
		}
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "PEER":
			decode = transfer.Peer(f[1])
		case len(f) == 1 && f[0] == "HEALTH":
			h := eng.Health()
			healthy := 0
			if h.Healthy {
				healthy = 1
			}
			say("HEALTH %d %s", healthy, strings.ReplaceAll(h.Reason+" ", " ", "_"))
		case len(f) == 8 && f[0] == "RECV":
			var v [5]uint64
			for i := range v {
				v[i], _ = strconv.ParseUint(f[i+1], 10, 64)
			}
			id, heads, nb, timeout := transfer.RequestID(v[0]), int64(v[1]), int64(v[2]), time.Duration(v[4])*time.Millisecond
			srcPlan, srcPool := seededPool(heads, nb, v[3], parseBlocks(f[6]))
			want := checksum(srcPlan, srcPool)
			dstPlan, _ := seededPool(heads, nb, 0, parseBlocks(f[7]))
			dstPool := make([]byte, dstPlan.Layout().SpanBytes())
			started := time.Now()
			h, err := eng.Receive(context.Background(), transfer.Spec{ID: id, Peer: decode, Plan: dstPlan, Pool: dstPool, Timeout: timeout})
			if err != nil {
				say("END %d refused:%v", id, strings.ReplaceAll(err.Error(), " ", "_"))
				continue
			}
			sends.Add(1)
			go func() {
				defer sends.Done()
				if !peerAwait(h, started, timeout, pc, func(format string, a ...any) { say(format, a...) }) {
					return
				}
				verdict := "-"
				if h.Status().State == transfer.Completed {
					verdict = "ok"
					if checksum(dstPlan, dstPool) != want {
						verdict = "corrupt"
					}
				}
				say("END %d %v %s", id, h.Status().State, verdict)
				_ = h.Release()
			}()
		case len(f) == 2 && f[0] == "CANCEL":
			id, _ := strconv.ParseUint(f[1], 10, 64)
			eng.Cancel(transfer.RequestID(id))
		case len(f) == 7 && f[0] == "SEND":
			var v [5]uint64
			for i := range v {
				v[i], _ = strconv.ParseUint(f[i+1], 10, 64)
			}
			blocks := parseBlocks(f[6])
			id, timeout := transfer.RequestID(v[0]), time.Duration(v[4])*time.Millisecond
			plan, pool := seededPool(int64(v[1]), int64(v[2]), v[3], blocks)
			started := time.Now()
			h, err := eng.Send(context.Background(), transfer.Spec{ID: id, Peer: decode, Plan: plan, Pool: pool, Timeout: timeout})
			if err != nil {
				say("END %d refused:%v", id, strings.ReplaceAll(err.Error(), " ", "_"))
				continue
			}
			sends.Add(1)
			go func() {
				defer sends.Done()
				if !peerAwait(h, started, timeout, pc, func(format string, a ...any) { say(format, a...) }) {
					return
				}
				say("END %d %v -", id, h.Status().State)
				_ = h.Release()
			}()
		default:
			say("ERR unknown line %q", line)
		}
	}
	// Bounded: every send goroutine ends within its own bound.
	waitBounded(&sends, closedChan(), pc.QueueTimeout+pc.QuarantineTimeout+time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), pc.QuarantineTimeout+pc.Grace)
	_ = eng.Drain(ctx)
	cancel()
	h := eng.Health()
	seen, reused, _ := n.slot.findings()
	say("POOL %d %d %d %d %d", h.TotalSlots, h.FreeSlots, h.PoisonedSlots, seen, len(reused))
	return eng.Close()
}

func closedChan() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// seedFill fills pool with the ChaCha8 stream of key.
func seedFill(key [32]byte, pool []byte) {
	_, _ = rand.NewChaCha8(key).Read(pool) // ChaCha8.Read never fails
}

// peerAwait waits, bounded, for a handle's outcome and quiescence, and reports a missed
// bound as WEDGED; it returns false when the handle never quiesced (it is then left alone).
func peerAwait(h *transfer.Handle, started time.Time, timeout time.Duration, pc peerConfig, say func(string, ...any)) bool {
	id := h.ID()
	doneBy := started.Add(pc.QueueTimeout + timeout + transfer.DefaultCancelGrace + pc.Grace + pc.Stopped)
	if !waitUntil(h.Done(), doneBy) {
		say("WEDGED %d no-outcome:%v", id, h.Status().State)
	}
	if !waitUntil(h.Quiesced(), doneBy.Add(pc.QuarantineTimeout+pc.Grace)) {
		say("WEDGED %d not-quiescent:%v", id, h.Status().State)
		return false
	}
	return true
}

// parseBlocks reads a comma-separated list of block ids.
func parseBlocks(s string) []int32 {
	var out []int32
	for _, b := range strings.Split(s, ",") {
		x, _ := strconv.ParseInt(b, 10, 32)
		out = append(out, int32(x))
	}
	return out
}
