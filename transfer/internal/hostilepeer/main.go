// SPDX-License-Identifier: Apache-2.0

//go:build cgo

// Command hostilepeer is the lying peer of the hostile peer harness (internal/hostile,
// docs/security.md "The hostile peer harness"): a process built on the engine's own wire code
// (transfer/internal/wire) over a real ucx.Transport, which answers a victim engine's requests
// with forged RMA offers and sends it forged hellos, proofs, claims and ContextParams. It is
// started by internal/hostile, never by people.
//
// -mode peer, one line at a time: it prints "ADDR <hex>" (its worker address) and
// "POOL <addr> <bytes>" (its registered pool), takes "PEER <hex>" (the victim's address) and
// "PIDS <third> <victim>" on stdin, prints "FORGED <forgery> <hex>" for each address it
// answers from with another process's pid (shared memory only), "OTHER <hex>" (a second,
// honest worker of this process: the peer whose name its forged hellos take) and "READY".
// Then it answers every request with FlagRMA by the forgery its id names
// (forgery.ForgeryOf), and takes "SEND <forgery> [<request id>]" (prints "SENT <forgery>") and
// "PARAMS <forgery>" (prints "PARAMS <hex blob>"). It exits when its stdin closes; any
// failure prints "ERR <reason>" and exits 1.
//
// -mode canary is the third process: it maps -len bytes at -at (where the peer's pool lies
// in the peer), fills them with forgery.Canary, prints "CANARY <pid>", answers "CHECK" with
// "CHECKED <bytes changed>" and exits when its stdin closes.
package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/internal/peerproc/forgery"
	"github.com/kvxfer/kvxfer/internal/transportimpl"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/internal/ucxhooks"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

type options struct {
	mode, tls, netDevs, key string
	seed                    uint64
	at                      uint64
	length                  int
}

func main() {
	var o options
	flag.StringVar(&o.mode, "mode", "peer", "peer or canary")
	flag.StringVar(&o.tls, "tls", "posix,cma,self", "UCX_TLS")
	flag.StringVar(&o.netDevs, "net-devices", "", "UCX_NET_DEVICES (tcp: lo)")
	flag.StringVar(&o.key, "key", "", "the cluster key this peer holds, hex (an insider); empty: none")
	flag.Uint64Var(&o.seed, "seed", 1, "pattern and randomness seed")
	flag.Uint64Var(&o.at, "at", 0, "canary: the address to map")
	flag.IntVar(&o.length, "len", 0, "canary: the bytes to map")
	flag.Parse()
	stdin := bufio.NewScanner(os.Stdin)
	stdin.Buffer(make([]byte, 1<<16), 1<<20)
	var err error
	switch o.mode {
	case "peer":
		err = runPeer(o, stdin)
	case "canary":
		err = runCanary(o, stdin)
	default:
		err = fmt.Errorf("-mode %q: want peer or canary", o.mode)
	}
	if err != nil {
		fmt.Printf("ERR %v\n", err)
		os.Exit(1)
	}
}

// runCanary is the third process: canary memory at the address of the peer's pool.
func runCanary(o options, stdin *bufio.Scanner) error {
	canary, err := forgery.MapAt(uintptr(o.at), o.length)
	if err != nil {
		return err
	}
	for i := range canary {
		canary[i] = forgery.Canary
	}
	fmt.Printf("CANARY %d\n", os.Getpid())
	for stdin.Scan() {
		if stdin.Text() == "CHECK" {
			changed := 0
			for _, b := range canary {
				if b != forgery.Canary {
					changed++
				}
			}
			fmt.Printf("CHECKED %d\n", changed)
		}
	}
	return nil
}

// peer is the lying process: its transports and the memory it registered.
type peer struct {
	o       options
	victim  transport.Peer
	keys    *wire.Keyring // the cluster key it holds; nil: none
	foreign *wire.Keyring // a key of another fleet
	insider [][]byte      // the raw key, for params
	tr      *ucx.Transport
	other   *ucx.Transport // an honest second worker: the peer forged hellos name
	region  *ucx.Region    // the registered pool (SecretBytes of secret on either side)
	seg     []byte         // a 1 MiB pool the transport allocated
	segKey  []byte
	mu      sync.Mutex
	rng     *mrand.Rand
	played  map[uint64]*wire.RMAOffer // ReplayedNonce: the first offer for a request id, replayed on its second request
}

func runPeer(o options, stdin *bufio.Scanner) error {
	p := &peer{o: o, rng: mrand.New(mrand.NewPCG(o.seed, 0x4853)), played: map[uint64]*wire.RMAOffer{}}
	foreign := make([]byte, wire.ClusterKeyBytes)
	_, _ = rand.Read(foreign)
	var err error
	if p.foreign, err = wire.NewKeyring([][]byte{foreign}); err != nil {
		return err
	}
	if o.key != "" {
		k, err := hex.DecodeString(o.key)
		if err != nil {
			return fmt.Errorf("-key: %w", err)
		}
		if p.keys, err = wire.NewKeyring([][]byte{k}); err != nil {
			return fmt.Errorf("-key: %w", err)
		}
		p.insider = [][]byte{k}
	}
	// ServeEmulatedRMA: the liar's honest offers are read by gets over TCP too
	cfg := ucx.Config{TLS: o.tls, NetDevices: o.netDevs, KeepaliveInterval: 200 * time.Millisecond, StagingBytes: 1 << 20,
		CloseTimeout: 2 * time.Second, ServeEmulatedRMA: true}
	if p.tr, err = ucx.New(cfg); err != nil {
		return err
	}
	defer func() { _ = p.tr.Close(true) }()
	if p.other, err = ucx.New(cfg); err != nil {
		return err
	}
	defer func() { _ = p.other.Close(true) }()
	// The pool, with the peer's own secret on either side of it, outside the registration.
	poolBytes := forgery.PoolBlocks * forgery.BlockBytes
	all, err := syscall.Mmap(-1, 0, poolBytes+2*forgery.SecretBytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return err
	}
	for i := range all {
		all[i] = forgery.Secret
	}
	pool := all[forgery.SecretBytes : forgery.SecretBytes+poolBytes]
	forgery.Fill(pool, o.seed)
	if p.region, err = p.tr.RegisterHost(pool); err != nil {
		return err
	}
	if p.seg, err = p.tr.AllocatePool(forgery.RequestBlocks * forgery.BlockBytes); err != nil {
		return err
	}
	forgery.Fill(p.seg, o.seed)
	if _, p.segKey, err = transportimpl.Of(p.tr).(transport.RMATransport).RMAKey(p.seg); err != nil {
		return err
	}
	fmt.Printf("ADDR %s\n", hex.EncodeToString(p.tr.WorkerAddress()))
	fmt.Printf("POOL %d %d\n", p.region.Addr(), p.region.Len())
	line := func(prefix string) (string, error) {
		if !stdin.Scan() {
			return "", fmt.Errorf("no %s line on stdin", prefix)
		}
		rest, ok := strings.CutPrefix(stdin.Text(), prefix+" ")
		if !ok {
			return "", fmt.Errorf("want %s, got %q", prefix, stdin.Text())
		}
		return rest, nil
	}
	victim, err := line("PEER")
	if err != nil {
		return err
	}
	p.victim = transport.Peer(victim)
	pids, err := line("PIDS")
	if err != nil {
		return err
	}
	var third, self int
	if _, err := fmt.Sscanf(pids, "%d %d", &third, &self); err != nil {
		return fmt.Errorf("PIDS %q: %w", pids, err)
	}
	if err := contract(p.tr).Bind(&answerer{p: p, tr: p.tr}); err != nil {
		return err
	}
	if err := contract(p.other).Bind(&answerer{p: p, tr: p.other, honest: true}); err != nil {
		return err
	}
	// Workers that answer in a name whose pid is another process's: the third one, the victim.
	for _, f := range []struct {
		forgery forgery.Forgery
		pid     int
	}{{forgery.PidOfThird, third}, {forgery.PidOfVictim, self}} {
		tr, err := ucx.New(cfg)
		if err != nil {
			return err
		}
		as, ok := forgePID(tr.WorkerAddress(), f.pid)
		if !ok {
			_ = tr.Close(true)
			continue // no cma pid in the address (TCP): nothing to forge
		}
		defer func() { _ = tr.Close(true) }()
		r, err := tr.RegisterHost(pool)
		if err != nil {
			return err
		}
		if err := contract(tr).Bind(&answerer{p: p, tr: tr, as: as, region: r, honest: true}); err != nil {
			return err
		}
		fmt.Printf("FORGED %s %s\n", f.forgery, as)
	}
	fmt.Printf("OTHER %s\n", hex.EncodeToString(p.other.WorkerAddress()))
	fmt.Println("READY")
	for stdin.Scan() {
		verb, arg, _ := strings.Cut(stdin.Text(), " ")
		name, rest, _ := strings.Cut(arg, " ")
		f, ok := forgery.ParseForgery(name)
		if !ok {
			return fmt.Errorf("unknown forgery %q", name)
		}
		switch verb {
		case "SEND":
			if err := p.send(f, rest); err != nil {
				return fmt.Errorf("SEND %s: %w", f, err)
			}
			fmt.Printf("SENT %s\n", f)
		case "PARAMS":
			blob, err := p.params(f)
			if err != nil {
				return fmt.Errorf("PARAMS %s: %w", f, err)
			}
			fmt.Printf("PARAMS %s\n", hex.EncodeToString(blob))
		default:
			return fmt.Errorf("unknown command %q", stdin.Text())
		}
	}
	return nil
}

// forgePID is addr with its cma entry's pid replaced by pid: what a peer that names another
// process sends. ok is false when the address names no pid (no cma).
func forgePID(addr []byte, pid int) (transport.Peer, bool) {
	real, ok := native.AddressInfo(addr, addr)
	if !ok || real.PID == 0 {
		return "", false
	}
	for i := 0; i+4 <= len(addr); i++ {
		v := binary.LittleEndian.Uint32(addr[i:])
		if int(v&^(1<<31)) != real.PID {
			continue
		}
		forged := bytes.Clone(addr)
		binary.LittleEndian.PutUint32(forged[i:], v&(1<<31)|uint32(pid))
		if h, ok := native.AddressInfo(forged, addr); ok && h.PID == pid && h.SameProcessSpace(real) {
			return ucx.PeerFromAddress(forged), true
		}
	}
	return "", false
}

// speech is what this build speaks; seal seals a handshake message with the held key.
func (p *peer) seal(m wire.Message) []byte {
	if p.keys != nil {
		return p.keys.SealMessage(m)
	}
	return wire.Encode(m)
}

// send sends the unsolicited forgery f ("SEND").
func (p *peer) send(f forgery.Forgery, arg string) error {
	var echo [wire.ChallengeBytes]byte
	_, _ = rand.Read(echo[:])
	all := wire.KnownFeatures | 1<<40
	switch f {
	case forgery.HelloForOther: // in the other worker's name: every feature, then a proof of nothing
		as := ucx.PeerFromAddress(p.other.WorkerAddress())
		if err := ucxhooks.Hooks.SendControlAs(p.tr, p.victim, as, p.seal(&wire.Hello{Min: wire.MinVersion, Max: wire.Version, Features: all})); err != nil {
			return err
		}
		return ucxhooks.Hooks.SendControlAs(p.tr, p.victim, as, p.seal(&wire.HelloProof{Echo: echo, Min: wire.MinVersion, Max: wire.Version, Features: all}))
	case forgery.UnsolicitedProof:
		return contract(p.tr).SendControl(p.victim, p.seal(&wire.HelloProof{Echo: echo, Min: wire.MinVersion, Max: wire.Version, Features: all}))
	case forgery.UnsealedHello:
		return contract(p.tr).SendControl(p.victim, wire.Encode(&wire.Hello{Min: wire.MinVersion, Max: wire.Version, Features: all}))
	case forgery.ForeignKeyHello:
		return contract(p.tr).SendControl(p.victim, p.foreign.SealMessage(&wire.Hello{Min: wire.MinVersion, Max: wire.Version, Features: all}))
	case forgery.ClaimWithoutProof, forgery.ClaimWrongProof:
		id, err := strconv.ParseUint(arg, 10, 64)
		if err != nil {
			return fmt.Errorf("request id %q: %w", arg, err)
		}
		whole, err := plan(forgery.PoolBlocks, 0)
		if err != nil {
			return err
		}
		ri := &wire.RequestInfo{Header: wire.Header{Request: transport.RequestID(id), Nonce: p.rng.Uint64() | 1},
			Shape: kvplan.ShapeOf(whole), ChunkBytes: 256 << 10, Depth: 2}
		if f == forgery.ClaimWrongProof {
			ri.Flags |= wire.FlagClaim
			ri.Claim = wire.Claim{Incarnation: p.rng.Uint64(), Proof: wire.ClaimProof(echo[:], ri.Request, 0, ri.Nonce, 1)}
		}
		return contract(p.tr).SendControl(p.victim, wire.Encode(ri))
	}
	return fmt.Errorf("not a forgery to send")
}

// params is the forged ContextParams blob of forgery f.
func (p *peer) params(f forgery.Forgery) ([]byte, error) {
	whole, err := plan(forgery.PoolBlocks, 0)
	if err != nil {
		return nil, err
	}
	secret := make([]byte, wire.ParamsSecretBytes)
	_, _ = rand.Read(secret)
	c := &ucx.ContextParams{RequestID: transport.RequestID(p.rng.Uint64() >> 8), Incarnation: p.rng.Uint64() | 1, WorkerAddress: p.tr.WorkerAddress(),
		Layout: whole.Layout(), Selection: whole.Selection(), Blocks: whole.Blocks(), Secret: secret}
	foreign := make([]byte, wire.ClusterKeyBytes)
	_, _ = rand.Read(foreign)
	switch f {
	case forgery.UnsignedParams:
	case forgery.ForeignParams:
		if err := c.Sign([][]byte{foreign}); err != nil {
			return nil, err
		}
	case forgery.TamperedParams: // sealed by the fleet's key where this peer holds it, then changed
		keys := p.insider
		if keys == nil {
			keys = [][]byte{foreign}
		}
		if err := c.Sign(keys); err != nil {
			return nil, err
		}
		c.RequestID++
	default:
		return nil, fmt.Errorf("not a params forgery")
	}
	return c.MarshalBinary()
}

// answerer answers the victim's messages to one of the peer's workers: honestly (the other
// worker, and those answering in a forged pid's name, as) or by the forgery a request names.
type answerer struct {
	p      *peer
	tr     *ucx.Transport
	as     transport.Peer // the name it answers in ("": its own)
	region *ucx.Region    // the pool it offers (nil: the peer's)
	honest bool
}

func (a *answerer) OnPeerLost(transport.Peer, error) {}

func (a *answerer) reply(to transport.Peer, b []byte) {
	if a.as != "" {
		_ = ucxhooks.Hooks.SendControlAs(a.tr, to, a.as, b)
		return
	}
	_ = contract(a.tr).SendControl(to, b)
}

func (a *answerer) OnControl(from transport.Peer, msg []byte) {
	m, err := wire.Decode(msg)
	if err != nil {
		return
	}
	p := a.p
	switch m := m.(type) {
	case *wire.Hello:
		if !m.Reply {
			a.reply(from, p.seal(&wire.Hello{Min: wire.MinVersion, Max: wire.Version, Reply: true, Features: wire.KnownFeatures}))
		}
	case *wire.HelloChallenge:
		a.reply(from, p.seal(&wire.HelloProof{Echo: m.Challenge, Min: wire.MinVersion, Max: wire.Version, Features: wire.KnownFeatures}))
	case *wire.Abort:
		a.reply(from, wire.Encode(&wire.AbortAck{Header: wire.Header{Sub: m.Sub, Request: m.Request, Nonce: m.Nonce}}))
	case *wire.RequestInfo:
		if m.Flags&wire.FlagRMA == 0 {
			return // a fallback to messages: this peer sends none, the victim's deadline ends it
		}
		f := forgery.Honest
		if !a.honest {
			f = forgery.ForgeryOf(uint64(m.Request))
		}
		for _, o := range a.offer(f, m) {
			if b, err := o.AppendBinary(nil); err == nil {
				a.reply(from, b)
			}
		}
	}
}

// offer is forgery f's answer to request ri: one offer, or its parts.
func (a *answerer) offer(f forgery.Forgery, ri *wire.RequestInfo) []*wire.RMAOffer {
	p := a.p
	region := a.region
	if region == nil {
		region = p.region
	}
	addr, key := ucxhooks.Hooks.RegionKey(region)
	whole, err := plan(forgery.PoolBlocks, 0)
	if err != nil {
		return nil
	}
	o := &wire.RMAOffer{Header: wire.Header{Sub: ri.Sub, Request: ri.Request, Nonce: ri.Nonce}, Addr: addr, PoolBytes: region.Len(),
		Layout: whole.Layout(), Selection: whole.Selection(), Blocks: append([]int32(nil), whole.Blocks()...), Key: key}
	shifted := func(blocks int64, first int32) {
		if q, err := plan(blocks, first); err == nil {
			o.Layout, o.Selection, o.Blocks = q.Layout(), q.Selection(), append([]int32(nil), q.Blocks()...)
		}
	}
	switch f {
	case forgery.OutsideRegistration: // block 0 is the secret before the registration
		o.Addr, o.PoolBytes = addr-forgery.SecretBytes, region.Len()+forgery.SecretBytes
		shifted(forgery.PoolBlocks+1, 0)
	case forgery.PastSegment:
		segAddr := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(p.seg))))
		o.Addr, o.PoolBytes, o.Key = segAddr, 2*int64(len(p.seg)), p.segKey
		shifted(2*forgery.RequestBlocks, forgery.RequestBlocks)
	case forgery.HugeLength:
		o.PoolBytes = 1 << 46
		shifted(o.PoolBytes/forgery.BlockBytes, 1<<20)
	case forgery.WrappingRange:
		o.Addr = ^uint64(0) - 4096
	case forgery.OverlappingParts:
		b := *o // positions 0..3, then 3..6: position 3 twice, 7 never
		o.Flags, o.Total, o.Blocks = wire.RMAOfferPart, len(o.Blocks), o.Blocks[:4]
		b.Flags, b.Total, b.First, b.Blocks = wire.RMAOfferPart, o.Total, 3, b.Blocks[4:]
		return []*wire.RMAOffer{o, &b}
	case forgery.GarbageKey:
		p.mu.Lock()
		o.Key = make([]byte, 16+p.rng.IntN(200))
		for i := range o.Key {
			o.Key[i] = byte(p.rng.Uint32())
		}
		p.mu.Unlock()
	case forgery.TruncatedKey:
		o.Key = key[:len(key)/2]
	case forgery.ReplayedNonce: // the first request is answered honestly; its offer is replayed on the second
		p.mu.Lock()
		defer p.mu.Unlock()
		old := p.played[uint64(ri.Request)]
		if old == nil || old.Nonce == ri.Nonce { // the first transfer, or its request repeated (RetryInterval)
			if old == nil && len(p.played) < 1024 {
				p.played[uint64(ri.Request)] = o
			}
			return []*wire.RMAOffer{o}
		}
		delete(p.played, uint64(ri.Request))
		return []*wire.RMAOffer{old, o}
	}
	return []*wire.RMAOffer{o}
}

// plan is the plan of forgery.RequestBlocks blocks from first in a block-major pool of blocks
// blocks of the harness's model.
func plan(blocks int64, first int32) (*layout.Plan, error) {
	l := layout.Packed(layout.Dims{NumLayers: forgery.NumLayers, KVFactor: forgery.KVFactor, NumHeads: forgery.NumHeads,
		HeadDim: forgery.HeadDim, ElemSize: forgery.ElemSize, TokensPerBlock: forgery.TokensPerBlock, NumBlocks: blocks}, layout.BlockMajor)
	ids := make([]int32, forgery.RequestBlocks)
	for i := range ids {
		ids[i] = first + int32(i)
	}
	return layout.NewPlan(l, l.All(), ids)
}

// contract is the transport contract behind tr (internal/transportimpl): the liar binds and
// sends control messages as the engine would, which a program's ucx.Transport does not show.
func contract(tr *ucx.Transport) transport.Transport {
	return transportimpl.Of(tr).(transport.Transport)
}
