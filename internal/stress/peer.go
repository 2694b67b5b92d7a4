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
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvxfer/kvxfer/internal/transferdefaults"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/discovery"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
	"github.com/kvxfer/kvxfer/transfer/tuning"
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
	// Plain turns the pull wire and the RMA mode off (the staging and direct routes' sender);
	// the other peer keeps the serving defaults.
	Plain bool `json:"plain"`
	// RMAMinRegionBytes is the engine's Config.Tuning.RMAMinRegionBytes (0: the default).
	RMAMinRegionBytes int64 `json:"rma_min_region_bytes"`
	// Windows and WindowBytes size the peer's two registered pools (one allocated by UCX, one
	// its own mmap registered with RegisterHost); 0 windows: none.
	Windows     int   `json:"windows"`
	WindowBytes int64 `json:"window_bytes"`
	// Registry, when set, is a discovery registry (http://...) where the peer publishes
	// itself as Name, with its transport's incarnation and address, and withdraws on SIGTERM.
	Registry string `json:"registry"`
	Name     string `json:"name"`
	// DrainFor is the deadline of the Drain a SIGTERM starts; Close follows it.
	DrainFor time.Duration `json:"drain_for"`
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
//	parent: SEND <id> <heads> <nb> <seed> <timeout-ms> <b1,b2,...> [<pool>]
//	                                          pool: go (default), alloc (UCX-allocated) or
//	                                          host (an mmap registered with RegisterHost)
//	parent: RECV <id> <heads> <nb> <seed> <timeout-ms> <src b1,...> <dst b1,...> [<pool>]
//	                                          receive, and check against the seeded source
//	parent: HEALTH                            peer: HEALTH <1|0> <reason>
//	parent: CANCEL <id>
//	peer: END <id> <state> <ok|corrupt|path> [<error class>]
//	                                          a send or receive quiesced; a receive names
//	                                          its error's sentinel (errorClass)
//	peer: WEDGED <id> <what>                  a send missed its bound
//	peer: BLOCKS <id> <path>                  a one-copy send's blocks poisoned (L9)
//	parent: closes stdin                      the peer drains and prints
//	peer: POOL <total> <free> <poisoned> <observed-poisoned> <reused>
//	parent: SIGTERM                           the peer withdraws from the registry, drains
//	                                          for DrainFor, closes its engine, and prints
//	peer: TERM <in-flight-at-close>           then POOL as above, and exits 0
func runPeer(pc peerConfig, stdin io.Reader, stdout io.Writer) error {
	defer useStalls()() // the wedge check credits the time this process could not run (stall.go)
	var outMu sync.Mutex
	say := func(format string, a ...any) {
		outMu.Lock()
		fmt.Fprintf(stdout, format+"\n", a...)
		outMu.Unlock()
	}
	// SIGTERM is a rolling restart's first step; it is caught before anything can be
	// in flight, so it always ends in the graceful drain below.
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	defer signal.Stop(term)
	tr, err := ucx.New(ucx.Config{TLS: pc.TLS, NetDevices: pc.NetDevices, KeepaliveInterval: 200 * time.Millisecond,
		StagingBytes: int64(pc.NumSlots) * pc.SlotBytes, CloseTimeout: 2 * time.Second})
	if err != nil {
		return err
	}
	pools, err := newPeerPools(tr, pc)
	if err != nil {
		_ = tr.Close(true)
		return err
	}
	// The host pool stays mapped until the process exits: the transport may hold it until
	// its Close, and nothing here outlives that.
	tracked := newUCXTracked(tr, pc.SlotBytes)
	n := &node{name: tr.Self(), slot: tracked.slots}
	eng, err := transfer.New(tracked, transfer.Config{
		SlotBytes:        pc.SlotBytes,
		MaxConcurrent:    pc.MaxConcurrent,
		StagingMemory:    tr.StagingMemory(),
		QueueTimeout:     pc.QueueTimeout,
		ProgressDeadline: pc.ProgressDeadline,
		CloseTimeout:     pc.QuarantineTimeout + pc.Grace,
		Observer:         n,
		Tuning:           tuning.Config{NumSlots: pc.NumSlots, QuarantineTimeout: pc.QuarantineTimeout, DisablePull: pc.Plain, DisableRMA: pc.Plain, RMAMinRegionBytes: pc.RMAMinRegionBytes},
	})
	if err != nil {
		_ = tr.Close(true)
		return err
	}
	n.eng = eng
	reg, err := publish(tr, pc)
	if err != nil {
		_ = eng.Close()
		return err
	}
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
	terminated := false
loop:
	for {
		var line string
		var ok bool
		select {
		case line, ok = <-lines:
		case <-life.C:
			break loop
		case <-term:
			terminated = true
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
		case (len(f) == 8 || len(f) == 9) && f[0] == "RECV":
			var v [5]uint64
			for i := range v {
				v[i], _ = strconv.ParseUint(f[i+1], 10, 64)
			}
			id, heads, nb, timeout := transfer.RequestID(v[0]), int64(v[1]), int64(v[2]), time.Duration(v[4])*time.Millisecond
			srcPlan, srcPool := seededPool(heads, nb, v[3], parseBlocks(f[6]))
			want := checksum(srcPlan, srcPool)
			dstPlan, _ := seededPool(heads, nb, 0, parseBlocks(f[7]))
			dstPool := make([]byte, dstPlan.Layout().SpanBytes())
			giveBack := func() {}
			if len(f) == 9 {
				var ok bool
				if dstPool, giveBack, ok = pools.place(f[8], dstPool); !ok {
					say("END %d refused:no_free_%s_window", id, f[8])
					continue
				}
			}
			started := time.Now()
			h, err := eng.Receive(context.Background(), transfer.Spec{ID: id, Peer: decode, Plan: dstPlan, Pool: dstPool, Timeout: timeout})
			if err != nil {
				giveBack()
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
				say("END %d %v %s %s", id, h.Status().State, verdict, errorClass(h.Status().Err))
				_ = h.Release()
				giveBack()
			}()
		case len(f) == 2 && f[0] == "CANCEL":
			id, _ := strconv.ParseUint(f[1], 10, 64)
			eng.Cancel(transfer.RequestID(id))
		case (len(f) == 7 || len(f) == 8) && f[0] == "SEND":
			var v [5]uint64
			for i := range v {
				v[i], _ = strconv.ParseUint(f[i+1], 10, 64)
			}
			blocks := parseBlocks(f[6])
			id, timeout := transfer.RequestID(v[0]), time.Duration(v[4])*time.Millisecond
			plan, pool := seededPool(int64(v[1]), int64(v[2]), v[3], blocks)
			giveBack := func() {}
			if len(f) == 8 {
				var ok bool
				if pool, giveBack, ok = pools.place(f[7], pool); !ok {
					say("END %d refused:no_free_%s_window", id, f[7])
					continue
				}
			}
			started := time.Now()
			h, err := eng.Send(context.Background(), transfer.Spec{ID: id, Peer: decode, Plan: plan, Pool: pool, Timeout: timeout})
			if err != nil {
				giveBack()
				say("END %d refused:%v", id, strings.ReplaceAll(err.Error(), " ", "_"))
				continue
			}
			sends.Add(1)
			go func() {
				defer sends.Done()
				if !peerAwait(h, started, timeout, pc, func(format string, a ...any) { say(format, a...) }) {
					return // never quiescent: its window stays out for good
				}
				say("END %d %v %v", id, h.Status().State, h.Path())
				_ = h.Release()
				giveBack()
			}()
		default:
			say("ERR unknown line %q", line)
		}
	}
	if terminated {
		return terminate(eng, n, reg, &sends, pc, say)
	}
	withdraw(reg)
	// Bounded: every send goroutine ends within its own bound.
	waitBounded(&sends, closedChan(), pc.QueueTimeout+pc.QuarantineTimeout+time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), pc.QuarantineTimeout+pc.Grace)
	_ = eng.Drain(ctx)
	cancel()
	h := eng.Health()
	seen, reused, _ := n.slot.findings()
	say("POOL %d %d %d %d %d", h.Numbers.TotalSlots, h.Numbers.FreeSlots, h.Numbers.PoisonedSlots, seen, len(reused))
	return eng.Close()
}

// terminate is the graceful shutdown a rolling restart asks for with SIGTERM, as a serving
// process does it (docs/serving.md, "Graceful shutdown"): out of the registry first, so no
// new work is routed here; Drain for DrainFor; Close, which cancels what is still in flight;
// then the pool report. It says how many transfers Close met (TERM), so the soak knows Close
// ran under load.
func terminate(eng *transfer.Engine, n *node, reg discovery.Registration, sends *sync.WaitGroup, pc peerConfig, say func(string, ...any)) error {
	withdraw(reg)
	ctx, cancel := context.WithTimeout(context.Background(), pc.DrainFor)
	_ = eng.Drain(ctx) // a deadline missed is the point: Close meets what is left
	cancel()
	say("TERM %d", eng.Health().Numbers.InFlight)
	closeErr := eng.Close()
	waitBounded(sends, closedChan(), pc.QueueTimeout+pc.QuarantineTimeout+time.Minute)
	h := eng.Health()
	seen, reused, _ := n.slot.findings()
	say("POOL %d %d %d %d %d", h.Numbers.TotalSlots, h.Numbers.FreeSlots, h.Numbers.PoisonedSlots, seen, len(reused))
	return closeErr
}

// publish puts the peer in the registry pc names (none: nil).
func publish(tr *ucx.Transport, pc peerConfig) (discovery.Registration, error) {
	if pc.Registry == "" {
		return nil, nil
	}
	r, err := discovery.Open(pc.Registry, discovery.Config{})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Open's registry fills in the build's wire protocol.
	reg, err := r.Publish(ctx, discovery.Worker{Name: pc.Name, Role: "prefill", Incarnation: tr.Incarnation(),
		Address: tr.WorkerAddress()})
	if err != nil {
		return nil, fmt.Errorf("publishing %s: %w", pc.Name, err)
	}
	return reg, nil
}

func withdraw(reg discovery.Registration) {
	if reg == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = reg.Withdraw(ctx) // the entry's TTL removes it anyway
}

// peerPools are a peer's registered pools, cut into windows: alloc by UCX (AllocatePool),
// host its own anonymous mmap registered with RegisterHost.
type peerPools struct {
	alloc, host *windows
	mapped      []byte
}

func newPeerPools(tr *ucx.Transport, pc peerConfig) (*peerPools, error) {
	p := &peerPools{}
	if pc.Windows == 0 {
		return p, nil
	}
	bytes := int64(pc.Windows) * pc.WindowBytes
	mem, err := tr.AllocatePool(bytes)
	if err != nil {
		return nil, err
	}
	p.alloc = newWindows(mem, pc.WindowBytes, pc.Windows)
	if p.mapped, err = syscall.Mmap(-1, 0, int(bytes), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE); err != nil {
		return nil, fmt.Errorf("mapping the host pool: %w", err)
	}
	if _, err := tr.RegisterHost(p.mapped); err != nil { // unregistered by the transport's Close
		p.unmap()
		return nil, err
	}
	p.host = newWindows(p.mapped, pc.WindowBytes, pc.Windows)
	return p, nil
}

// place copies a request's seeded pool into a free window of the pool kind names, and
// returns the window and how to give it back; go keeps the seeded pool itself.
func (p *peerPools) place(kind string, seeded []byte) ([]byte, func(), bool) {
	w := p.alloc
	switch kind {
	case "go":
		return seeded, func() {}, true
	case "host":
		w = p.host
	case "alloc":
	default:
		return nil, nil, false
	}
	if w == nil {
		return nil, nil, false
	}
	i, mem, ok := w.take()
	if !ok || int64(len(seeded)) > w.size {
		if ok {
			w.put(i)
		}
		return nil, nil, false
	}
	copy(mem, seeded)
	return mem[:len(seeded)], func() { w.put(i) }, true
}

func (p *peerPools) unmap() {
	if p.mapped != nil {
		_ = syscall.Munmap(p.mapped)
		p.mapped = nil
	}
}

// seedFill fills pool with the ChaCha8 stream of key.
func seedFill(key [32]byte, pool []byte) {
	_, _ = rand.NewChaCha8(key).Read(pool) // ChaCha8.Read never fails
}

// peerAwait waits, bounded, for a handle's outcome and quiescence, and reports a missed
// bound as WEDGED; it returns false when the handle never quiesced (it is then left alone).
func peerAwait(h *transfer.Handle, started time.Time, timeout time.Duration, pc peerConfig, say func(string, ...any)) bool {
	id := h.ID()
	doneBy := started.Add(pc.QueueTimeout + timeout + transferdefaults.CancelGrace + pc.Grace + pc.Stopped)
	quietBy := doneBy.Add(pc.QuarantineTimeout + pc.Grace)
	if ok, credit := waitCredited(h.Done(), started, doneBy); !ok {
		st := h.Status()
		note := creditNote(credit) + lateNote(h.Done(), doneBy.Add(credit), quietBy)
		say("WEDGED %d no-outcome:%v:%v%s", id, st.State, h.Path(), strings.ReplaceAll(note, " ", "_"))
	}
	if ok, _ := waitCredited(h.Quiesced(), started, quietBy); !ok {
		st := h.Status()
		if st.BlocksPoisoned {
			// L9 on the one-copy path, as in the in-process soak: an operation on the
			// caller's own blocks never said whether it let go; the handle never quiesces,
			// by design, and its blocks (its window) are never reused.
			say("BLOCKS %d %v", id, h.Path())
			_ = h.Release()
			return false
		}
		say("WEDGED %d not-quiescent:%v:%v:%v", id, st.State, h.Path(), strings.ReplaceAll(fmt.Sprint(st.Err), " ", "_"))
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
