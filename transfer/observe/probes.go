// SPDX-License-Identifier: Apache-2.0

package observe

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/transfer"
)

// live is the liveness half of a health verdict: false only when a restart is what helps,
// because the engine is closed, its transport reports that nothing will reach it any more
// (Health.Numbers.TransportWedged), or its mover could not say whether a copy ended
// (Health.Numbers.MoverWedged: the device is not trusted). A stall (transfers in flight, none progressing: a frozen
// or dead peer), a quarantine over budget or a shortage of staging slots makes an engine
// unready, not dead: restarting it would not unfreeze its peer.
func live(h transfer.Health) bool {
	return !h.Numbers.Closed && !h.Numbers.TransportWedged && !h.Numbers.MoverWedged
}

// defaultLivenessTimeout is how long /livez waits for the engine's Health call when
// no test set another: shorter than Kubernetes' default probe timeout (1s).
const defaultLivenessTimeout = 500 * time.Millisecond

// Pending is a HealthSource for a process whose engine does not exist yet (it is made once a
// peer has said which layout to use, say), so that its probes answer from the moment the
// process starts: until Set it reports live and not ready, with the reason given. Safe for
// concurrent use.
type Pending struct {
	reason string
	src    atomic.Pointer[HealthSource]
}

// NewPending returns a Pending that reports reason ("waiting for a peer") until Set.
func NewPending(reason string) *Pending { return &Pending{reason: reason} }

// Set hands the probes to src (the engine) from now on; nil goes back to pending.
func (p *Pending) Set(src HealthSource) {
	if src == nil {
		p.src.Store(nil)
		return
	}
	p.src.Store(&src)
}

// Health implements HealthSource.
func (p *Pending) Health() transfer.Health {
	if s := p.src.Load(); s != nil {
		return (*s).Health()
	}
	return transfer.Health{Reason: "no engine yet: " + p.reason}
}

// liveness asks Health with a bound, never more than one call at a time: a Health that does
// not return (an engine stuck on a lock) fails the probe within the timeout, and later probes
// fail at once rather than stacking goroutines behind it.
type liveness struct {
	src     HealthSource
	timeout time.Duration
	mu      sync.Mutex
	pending chan transfer.Health // the outstanding call's answer; nil when none
}

// check returns the engine's health, or ok=false when it did not answer within the timeout.
func (l *liveness) check() (h transfer.Health, ok bool) {
	l.mu.Lock()
	ch := l.pending
	if ch == nil {
		ch = make(chan transfer.Health, 1)
		l.pending = ch
		go func() { ch <- l.src.Health() }()
	}
	l.mu.Unlock()
	t := time.NewTimer(l.timeout)
	defer t.Stop()
	select {
	case h = <-ch:
		l.mu.Lock()
		if l.pending == ch {
			l.pending = nil
		}
		l.mu.Unlock()
		return h, true
	case <-t.C:
		return transfer.Health{}, false
	}
}

// serveLivez answers /livez.
func (l *liveness) serveLivez(w http.ResponseWriter, r *http.Request, log *zap.Logger) {
	h, ok := l.check()
	switch {
	case !ok:
		writeProbe(w, r, false, fmt.Sprintf("the engine did not answer its health call within %v", l.timeout), log, livezPath)
	case live(h):
		writeProbe(w, r, true, "", log, livezPath)
	default:
		writeProbe(w, r, false, h.Reason, log, livezPath)
	}
}

// writeProbe writes a probe's answer: 200 "ok" or 503 with the reason.
func writeProbe(w http.ResponseWriter, r *http.Request, pass bool, reason string, log *zap.Logger, path string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if pass {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok\n"))
		return
	}
	if reason == "" {
		reason = "unhealthy (no reason given)"
	}
	log.Debug("probe answered unhealthy", zap.String("probe", path), zap.String("reason", reason), zap.String("remote", r.RemoteAddr))
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write([]byte(reason + "\n"))
}

// probeMethods refuses anything but GET and HEAD; it reports whether the request may go on.
func probeMethods(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return false
	}
	return true
}
