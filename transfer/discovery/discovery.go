// SPDX-License-Identifier: Apache-2.0

package discovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/discovery/internal/retry"
	"github.com/kvxfer/kvxfer/transfer/internal/peernames"
	"github.com/kvxfer/kvxfer/transfer/internal/stale"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
	"go.uber.org/zap"
)

// Errors of the package (defined once in internal/retry, which the backends share).
var (
	// ErrNotFound: no live worker has that name (it never published, withdrew, or died and
	// its lease ran out).
	ErrNotFound = retry.ErrNotFound
	// ErrUnavailable: the registry did not answer within Config.LookupTimeout, retries
	// included; the error names the registry, the call and how often it was tried.
	ErrUnavailable = retry.ErrUnavailable
	// ErrInvalid: a Worker, target or Config is malformed; nothing was published.
	ErrInvalid = retry.ErrInvalid
	// ErrClosed: the Registry is closed.
	ErrClosed = retry.ErrClosed
)

// Worker is what one worker publishes about itself.
type Worker struct {
	// Name is unique in the deployment ("prefill-0"): letters, digits, '.', '_', '-', at
	// most 128.
	Name string `json:"name"`
	// Role is what it does: "prefill" or "decode", say. Required.
	Role string `json:"role"`
	// Incarnation identifies this life of the worker (ContextParams.Incarnation for a UCX
	// transport); a restarted worker publishes a new one. Non-zero.
	Incarnation uint64 `json:"incarnation"`
	// Address is the transport's address (ucx.Transport.WorkerAddress); empty while the
	// worker has no engine yet.
	Address []byte `json:"address,omitempty"`
	// Endpoints are named addresses of the worker's other services: "control", "http".
	Endpoints map[string]string `json:"endpoints,omitempty"`
	// Protocol is the wire protocol version and features the worker speaks.
	Protocol Protocol `json:"protocol"`
}

// Protocol is the engine wire protocol a worker speaks, for others to check before they
// meet it. A Registry from Open fills a Worker's zero Protocol with this build's
// (BuildProtocol). Engines also exchange versions and features when they first meet, so these
// fields inform; they do not replace that check.
type Protocol struct {
	// Version is the highest wire version the worker's engine speaks.
	Version int `json:"version"`
	// MinVersion is the lowest; zero when the publisher did not say.
	MinVersion int `json:"min_version,omitempty"`
	// Features are the engine's features by name ("streaming", "rma", ...).
	Features []string `json:"features,omitempty"`
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// maxQuoted bounds how much of a string from input (a registry entry, a name a caller passed)
// an error quotes: enough to recognise it, never a whole 200 KiB field.
const maxQuoted = 64

// quoteInput quotes s for an error, cut to maxQuoted bytes with its full length said.
func quoteInput(s string) string {
	if len(s) <= maxQuoted {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:maxQuoted], len(s))
}

// Validate checks what Publish requires; the error matches ErrInvalid and names the field.
func (w *Worker) Validate() error {
	switch {
	case !nameRE.MatchString(w.Name):
		return fmt.Errorf("%w: Worker.Name %s: want 1 to 128 of [A-Za-z0-9._-]", ErrInvalid, quoteInput(w.Name))
	case w.Role == "" || len(w.Role) > 64:
		return fmt.Errorf("%w: Worker.Role %s: want 1 to 64 bytes", ErrInvalid, quoteInput(w.Role))
	case w.Incarnation == 0:
		return fmt.Errorf("%w: Worker.Incarnation: zero (give each life of the worker its own, non-zero)", ErrInvalid)
	case len(w.Address) > wire.ParamsMaxAddress:
		return fmt.Errorf("%w: Worker.Address: %d bytes, at most %d", ErrInvalid, len(w.Address), wire.ParamsMaxAddress)
	}
	return nil
}

// checkEntry checks a worker entry a registry answered with, as Publish checks what it
// announces: a registry is input like any peer, and an entry that fails is refused with an
// error that quotes at most maxQuoted bytes of it.
func checkEntry(registry, name string, w Worker) error {
	if err := w.Validate(); err != nil {
		return fmt.Errorf("kvxfer/discovery: entry for %s from %s: %w", name, registry, err)
	}
	if w.Name != name {
		return fmt.Errorf("%w: entry for %s from %s names %s", ErrInvalid, name, registry, quoteInput(w.Name))
	}
	return nil
}

// Registry publishes workers and looks them up. Implementations are safe for concurrent use.
type Registry interface {
	// Publish announces w and keeps it announced (renewing its lease) until the
	// Registration is withdrawn or the Registry closed. Publishing the same name again
	// replaces the entry: a restarted worker, with its new Incarnation.
	Publish(ctx context.Context, w Worker) (Registration, error)
	// Lookup returns the live worker called name, or an error matching ErrNotFound. An
	// unreachable registry is retried with backoff, bounded by Config.LookupTimeout and ctx.
	Lookup(ctx context.Context, name string) (Worker, error)
	// List returns the live workers of role ("" for all), sorted by name; retried as Lookup.
	List(ctx context.Context, role string) ([]Worker, error)
	// Close withdraws every Registration made through it and releases the connection.
	Close() error
}

// Registration is one published worker.
type Registration interface {
	// Withdraw removes the entry (only if it is still this incarnation's) and stops
	// renewing it. Safe to call more than once.
	Withdraw(ctx context.Context) error
}

// Config configures both backends.
type Config struct {
	// TTL is how long a worker's entry outlives its last renewal: a dead worker disappears
	// within it. Default 10s; at least 1s (etcd's minimum lease).
	TTL time.Duration
	// LookupTimeout bounds a lookup's retries against an unreachable registry. Default 5s.
	LookupTimeout time.Duration
	// Logger hears about renewals that failed and entries re-published. Default no-op.
	Logger *zap.Logger
}

// Defaults of Config, documented on its fields.
const (
	defaultTTL           = 10 * time.Second
	defaultLookupTimeout = 5 * time.Second
	minTTL               = time.Second
)

func (c Config) withDefaults() (Config, error) {
	if c.TTL == 0 {
		c.TTL = defaultTTL
	}
	if c.LookupTimeout == 0 {
		c.LookupTimeout = defaultLookupTimeout
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	switch {
	case c.TTL < minTTL:
		return c, fmt.Errorf("%w: Config.TTL %v: at least %v", ErrInvalid, c.TTL, minTTL)
	case c.LookupTimeout < 0:
		return c, fmt.Errorf("%w: Config.LookupTimeout %v: negative", ErrInvalid, c.LookupTimeout)
	}
	c.TTL = c.TTL.Round(time.Second)
	return c, nil
}

// Open connects to the registry target names: "http://HOST:PORT" (an embedded registry,
// Handler), or a target of a backend linked in by importing its package, such as
// "etcd://HOST:PORT[,HOST:PORT...][/PREFIX]" (package transfer/discovery/etcd; default prefix
// "/kvxfer"). It does not wait for the registry to answer: a registry that is down yet makes
// the first calls retry. Every backend's answers are checked as Publish checks a Worker:
// a lookup of a malformed name, or an entry that is malformed or names another worker, fails
// with ErrInvalid; List skips malformed entries (logged).
func Open(target string, cfg Config) (Registry, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("%w: target %s: %v", ErrInvalid, quoteInput(target), err)
	}
	if u.Scheme == "http" {
		if u.Host == "" {
			return nil, fmt.Errorf("%w: target %s: no host", ErrInvalid, quoteInput(target))
		}
		return checked{newHTTPRegistry(strings.TrimSuffix(target, "/"), cfg), target, cfg.Logger}, nil
	}
	backends.Lock()
	open := backends.open[u.Scheme]
	backends.Unlock()
	if open == nil {
		hint := ""
		if u.Scheme == "etcd" {
			hint = ` (link the backend: import _ "github.com/kvxfer/kvxfer/transfer/discovery/etcd")`
		}
		return nil, fmt.Errorf("%w: target %s: want http://HOST:PORT or a linked backend's scheme%s", ErrInvalid, quoteInput(target), hint)
	}
	r, err := open(target, u, cfg)
	if err != nil {
		return nil, err
	}
	return checked{r, target, cfg.Logger}, nil
}

// backends are the registries linked in besides the HTTP one, by URL scheme.
var backends = struct {
	sync.Mutex
	open map[string]BackendOpener
}{open: map[string]BackendOpener{}}

// BackendOpener opens a registry backend for target (already parsed as u), with cfg's
// defaults applied and validated.
type BackendOpener func(target string, u *url.URL, cfg Config) (Registry, error)

// RegisterBackend makes Open accept targets of scheme. A backend's package calls it from its
// init, so a program links a backend (and its client library) only by importing it. It
// panics if scheme is "http" or already registered, as a programming error.
func RegisterBackend(scheme string, open BackendOpener) {
	backends.Lock()
	defer backends.Unlock()
	if _, dup := backends.open[scheme]; dup || scheme == "http" || open == nil {
		panic("kvxfer/discovery: RegisterBackend: scheme " + scheme + " taken, or no opener")
	}
	backends.open[scheme] = open
}

// BuildProtocol is what this build's engines speak: the wire versions they say in their hellos
// and the features they offer.
func BuildProtocol() Protocol {
	return Protocol{Version: wire.Version, MinVersion: wire.MinVersion, Features: strings.Split(wire.KnownFeatures.String(), "+")}
}

// WaitFor looks name up until it appears, the registry fails otherwise, or ctx ends: a decode
// worker that starts before its prefill worker waits for it with one call. A name that never
// appeared before ctx ended fails with an error matching ErrNotFound and ctx's error.
func WaitFor(ctx context.Context, r Registry, name string) (Worker, error) {
	wait := 20 * time.Millisecond
	for {
		w, err := r.Lookup(ctx, name)
		if err == nil {
			return w, nil
		}
		if !errors.Is(err, ErrNotFound) && ctx.Err() == nil {
			return Worker{}, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return Worker{}, fmt.Errorf("%w: %q did not appear before %w", ErrNotFound, name, context.Cause(ctx))
		case <-t.C:
		}
		wait = min(2*wait, 250*time.Millisecond)
	}
}

// checked wraps every backend with the checks a registry's answers need whoever stores them:
// the registry is input like any peer.
type checked struct {
	Registry
	target string
	log    *zap.Logger
}

func (c checked) Publish(ctx context.Context, w Worker) (Registration, error) {
	if w.Protocol.Version == 0 && w.Protocol.MinVersion == 0 && len(w.Protocol.Features) == 0 {
		w.Protocol = BuildProtocol()
	}
	return c.Registry.Publish(ctx, w)
}

func (c checked) Lookup(ctx context.Context, name string) (Worker, error) {
	if !nameRE.MatchString(name) {
		return Worker{}, fmt.Errorf("%w: name %s", ErrInvalid, quoteInput(name))
	}
	w, err := c.Registry.Lookup(ctx, name)
	if err == nil {
		err = checkEntry(c.target, name, w)
	}
	if err == nil {
		rememberName(w)
	}
	return w, err
}

// rememberName labels a worker's transport peer with its name in this process's logs
// (transport.Peer.Short). A handover's entry carries params, not a worker's address.
func rememberName(w Worker) {
	if w.Role != handoverRole && len(w.Address) > 0 {
		peernames.Remember(string(ucx.PeerFromAddress(w.Address)), w.Name)
	}
}

func (c checked) List(ctx context.Context, role string) ([]Worker, error) {
	ws, err := c.Registry.List(ctx, role)
	out := ws[:0]
	for _, w := range ws {
		if verr := w.Validate(); verr != nil {
			c.log.Warn("skipping a malformed worker entry", zap.String("registry", c.target), zap.Error(verr))
			continue
		}
		rememberName(w)
		out = append(out, w)
	}
	return out, err
}

// LostPeers is what the receiving engine knows of the peers its transport lost:
// *transfer.Engine implements it. A registry entry outlives its worker by up to Config.TTL;
// the transport usually knows sooner.
type LostPeers interface {
	// PeerLost returns an error matching transfer.ErrPeerLost when the transport reported
	// peer lost (and it has not spoken since), nil otherwise. It never blocks.
	PeerLost(peer transfer.Peer) error
}

// CheckParams compares cp with what the receiving engine and the registry know of its sender,
// the worker called name, now. A sender whose transport address the engine's transport
// reported lost (lost; nil skips this) fails at once with an error matching
// transfer.ErrPeerLost that names the worker, though its registry entry may still be there.
// Otherwise the registry must list the same transport address and Incarnation: a sender that
// died (no entry) or restarted (another incarnation or address) fails at once with an error
// matching ucx.ErrStaleIncarnation. Either way the request is refused rather than left to
// wait out its deadline; an unreachable registry fails with ErrUnavailable.
func CheckParams(ctx context.Context, r Registry, name string, cp *ucx.ContextParams, lost LostPeers) error {
	if lost != nil {
		if err := lost.PeerLost(ucx.PeerFromAddress(cp.WorkerAddress)); err != nil {
			return fmt.Errorf("kvxfer/discovery: worker %s: %w", name, err)
		}
	}
	w, err := r.Lookup(ctx, name)
	if errors.Is(err, ErrNotFound) {
		return &stale.Error{Peer: name, Have: cp.Incarnation, Reason: "the worker is gone from the registry"}
	}
	if err != nil {
		return err
	}
	if w.Incarnation != cp.Incarnation {
		return &stale.Error{Peer: name, Have: cp.Incarnation, Current: w.Incarnation, Reason: "the worker restarted"}
	}
	if len(w.Address) > 0 && !bytes.Equal(w.Address, cp.WorkerAddress) {
		return &stale.Error{Peer: name, Have: cp.Incarnation, Current: w.Incarnation, Reason: "the worker's transport address changed"}
	}
	return nil
}
