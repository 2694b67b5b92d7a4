// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"encoding/hex"

	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/internal/ucxhooks"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// The engine's UCX tests (package transfer) look inside the transport through these; see
// package ucxhooks.
func init() {
	h := &ucxhooks.Hooks
	h.InjectPeerLost = func(tr any, peer transport.Peer, err error) { hookImpl(tr).push(ucxReport{lost: peer, err: err}) }
	h.RemotePools = func(tr any) int {
		t := hookImpl(tr)
		t.mu.Lock()
		defer t.mu.Unlock()
		pools := map[ucxKeyID]bool{}
		for id := range t.rma.keys {
			id.lane = 0
			pools[id] = true
		}
		return len(pools)
	}
	h.RemoteKeys = func(tr any) int {
		t := hookImpl(tr)
		t.mu.Lock()
		defer t.mu.Unlock()
		return len(t.rma.keys)
	}
	h.Worker = func(tr any) *native.Worker {
		t := hookImpl(tr)
		t.mu.Lock()
		defer t.mu.Unlock()
		return t.w
	}
	h.LaneWorkers = func(tr any) []*native.Worker {
		t := hookImpl(tr)
		t.mu.Lock()
		defer t.mu.Unlock()
		var ws []*native.Worker
		for _, l := range t.rma.lanes.extra {
			ws = append(ws, l.w)
		}
		return ws
	}
	h.SetBeforeConnect = func(tr any, f func()) {
		t := hookImpl(tr)
		t.mu.Lock()
		t.beforeConnect = f
		t.mu.Unlock()
	}
	h.SetBeforeUnpack = func(tr any, f func()) {
		t := hookImpl(tr)
		t.mu.Lock()
		t.beforeUnpack = f
		t.mu.Unlock()
	}
	h.ProbeSeen = func(tr any) (bool, uint64) {
		p := hookImpl(tr).probe.Load()
		if p == nil {
			return false, 0
		}
		return true, p.seen.Load()
	}
	h.Ops = func(tr any) int {
		t := hookImpl(tr)
		t.mu.Lock()
		defer t.mu.Unlock()
		return len(t.ops)
	}
	h.Registrations = func(tr any) int { return hookImpl(tr).registrations() }
	h.ReplacesWedgedWorker = func(tr any) bool { return hookImpl(tr).cfg.ReplaceWedgedWorker }
	h.AllowSameProcessCMA = func(tr any) { hookImpl(tr).cma.allowSelf = true }
	h.WrapCMAReadv = func(tr any, wrap func(ucxhooks.CMAReadv) ucxhooks.CMAReadv) {
		t := hookImpl(tr)
		t.cma.readv = wrap(t.cma.readv)
	}
	h.CMAReadsStuck = func(tr any) int { return int(hookImpl(tr).cma.stuck.Load()) }
	h.Endpoints = func(tr any, peer transport.Peer) int {
		t := hookImpl(tr)
		t.mu.Lock()
		defer t.mu.Unlock()
		n := 0
		if t.eps[peer] != nil {
			n++
		}
		for _, l := range t.rma.lanes.extra {
			if l.eps[peer] != nil {
				n++
			}
		}
		return n
	}
	h.RegionKey = func(region any) (uint64, []byte) { return region.(*Region).remoteKey() }
	h.SendControlAs = func(tr any, to, as transport.Peer, msg []byte) error {
		t := hookImpl(tr)
		from, err := hex.DecodeString(string(as))
		if err != nil {
			return err
		}
		if err := t.ensureEndpoint(to); err != nil {
			return err
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		ep, err := t.endpointLocked(to)
		if err != nil {
			return err
		}
		ep.TagSendBytes(ucxControlFrame(from, msg), ucxKindCtrl)
		return nil
	}
}

// hookImpl is the UCX transport behind tr: a *Transport a test holds, its implementation, or
// a device transport.
func hookImpl(tr any) *ucxTransport {
	switch t := tr.(type) {
	case *Transport:
		return t.u
	case *deviceTransport:
		return t.ucxTransport
	}
	return tr.(*ucxTransport)
}
