// SPDX-License-Identifier: Apache-2.0

package discovery

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/transfer/discovery/internal/retry"
	"go.uber.org/zap"
)

// The embedded registry is a small HTTP service, under the path prefix WorkersPath:
//
//	PUT    /v1/workers/NAME?ttl=SECONDS   publish or renew (body: the Worker as JSON)
//	DELETE /v1/workers/NAME?incarnation=N withdraw, only if N is still the current one
//	GET    /v1/workers/NAME               the worker, or 404
//	GET    /v1/workers?role=ROLE          the live workers, sorted by name
//
// An entry not renewed within its ttl is gone.

// WorkersPath is the embedded registry's path prefix; mount Handler there on a mux of your
// own (or pass Handler as observe.HandlerConfig.Registry, which does).
const WorkersPath = "/v1/workers"

const maxEntryBytes = 256 << 10

// Handler returns the embedded registry's HTTP handler, holding entries in memory. Mount it
// at WorkersPath ("/v1/workers") and under it ("/v1/workers/").
func Handler() http.Handler {
	return &memRegistry{entries: map[string]memEntry{}, now: time.Now}
}

type memEntry struct {
	w       Worker
	expires time.Time
}

type memRegistry struct {
	mu      sync.Mutex
	entries map[string]memEntry
	now     func() time.Time
}

func (m *memRegistry) live(name string) (Worker, bool) {
	e, ok := m.entries[name]
	if ok && !m.now().Before(e.expires) {
		delete(m.entries, name)
		ok = false
	}
	return e.w, ok
}

func (m *memRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name := ""
	if p := r.URL.Path; len(p) > len(WorkersPath)+1 && p[:len(WorkersPath)+1] == WorkersPath+"/" {
		name = p[len(WorkersPath)+1:]
	} else if p != WorkersPath && p != WorkersPath+"/" {
		http.NotFound(w, r)
		return
	}
	if name != "" && !nameRE.MatchString(name) {
		http.Error(w, fmt.Sprintf("bad worker name %s", quoteInput(name)), http.StatusBadRequest)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case r.Method == http.MethodGet && name == "":
		role := r.URL.Query().Get("role")
		out := []Worker{}
		for n := range m.entries {
			if wk, ok := m.live(n); ok && (role == "" || wk.Role == role) {
				out = append(out, wk)
			}
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
		writeJSON(w, out)
	case r.Method == http.MethodGet:
		wk, ok := m.live(name)
		if !ok {
			http.Error(w, "no such worker", http.StatusNotFound)
			return
		}
		writeJSON(w, wk)
	case r.Method == http.MethodPut && name != "":
		ttl, err := strconv.Atoi(r.URL.Query().Get("ttl"))
		if err != nil || ttl < 1 || ttl > 3600 {
			http.Error(w, "ttl: want 1 to 3600 seconds", http.StatusBadRequest)
			return
		}
		var wk Worker
		body, err := io.ReadAll(io.LimitReader(r.Body, maxEntryBytes+1))
		if err == nil && len(body) > maxEntryBytes {
			err = errors.New("entry too large")
		}
		if err == nil {
			err = json.Unmarshal(body, &wk)
		}
		if err == nil {
			err = wk.Validate()
		}
		if err == nil && wk.Name != name {
			err = fmt.Errorf("body names %s, path %s", quoteInput(wk.Name), quoteInput(name))
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		m.entries[name] = memEntry{w: wk, expires: m.now().Add(time.Duration(ttl) * time.Second)}
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodDelete && name != "":
		inc, err := strconv.ParseUint(r.URL.Query().Get("incarnation"), 10, 64)
		if err != nil {
			http.Error(w, "incarnation: want a number", http.StatusBadRequest)
			return
		}
		if wk, ok := m.live(name); ok && wk.Incarnation == inc {
			delete(m.entries, name)
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v)
}

// httpRegistry is the client of the embedded registry.
// attempt bounds one call to the registry, so a retry loop notices an unreachable one within
// its bound.
const attempt = time.Second

type httpRegistry struct {
	base   string
	cfg    Config
	client *http.Client

	mu     sync.Mutex
	closed bool
	regs   map[*httpRegistration]struct{}
}

func newHTTPRegistry(base string, cfg Config) *httpRegistry {
	return &httpRegistry{base: base, cfg: cfg, regs: map[*httpRegistration]struct{}{},
		client: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), Timeout: attempt}}
}

// httpStatusError is an answer the registry gave: permanent, not retried.
type httpStatusError struct {
	code int
	body string
}

func (e *httpStatusError) Error() string {
	return fmt.Sprintf("registry answered %d: %s", e.code, quoteInput(e.body))
}

func (r *httpRegistry) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// do sends one request; a 4xx answer is permanent (ErrNotFound for 404, ErrInvalid for the
// rest), anything else is retried.
func (r *httpRegistry) do(ctx context.Context, method, path string, body []byte, out any) error {
	if r.isClosed() {
		return ErrClosed
	}
	req, err := http.NewRequestWithContext(ctx, method, r.base+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%w: %s", ErrNotFound, path)
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		return fmt.Errorf("%w: %w", ErrInvalid, &httpStatusError{resp.StatusCode, string(bytes.TrimSpace(b))})
	case resp.StatusCode >= 300:
		return &httpStatusError{resp.StatusCode, string(bytes.TrimSpace(b))}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("kvxfer/discovery: malformed answer from %s: %w", r.base, err)
		}
	}
	return nil
}

// Publish implements Registry.
func (r *httpRegistry) Publish(ctx context.Context, w Worker) (Registration, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	body, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	g := &httpRegistration{r: r, w: w, body: body, stop: make(chan struct{}), done: make(chan struct{})}
	if err := retry.Retry(ctx, r.cfg.LookupTimeout, r.base, "publish "+w.Name, g.put); err != nil {
		return nil, err
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, ErrClosed
	}
	r.regs[g] = struct{}{}
	r.mu.Unlock()
	go g.heartbeat()
	return g, nil
}

// Lookup implements Registry.
func (r *httpRegistry) Lookup(ctx context.Context, name string) (Worker, error) {
	var w Worker
	err := retry.Retry(ctx, r.cfg.LookupTimeout, r.base, "lookup "+name, func(ctx context.Context) error {
		return r.do(ctx, http.MethodGet, WorkersPath+"/"+name, nil, &w)
	})
	return w, err
}

// List implements Registry.
func (r *httpRegistry) List(ctx context.Context, role string) ([]Worker, error) {
	var out []Worker
	q := ""
	if role != "" {
		q = "?role=" + url.QueryEscape(role)
	}
	err := retry.Retry(ctx, r.cfg.LookupTimeout, r.base, "list", func(ctx context.Context) error {
		out = nil
		return r.do(ctx, http.MethodGet, WorkersPath+q, nil, &out)
	})
	return out, err
}

// Close implements Registry.
func (r *httpRegistry) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	regs := r.regs
	r.regs = nil
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), attempt)
	defer cancel()
	var errs []error
	for g := range regs {
		errs = append(errs, g.withdraw(ctx))
	}
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.client.CloseIdleConnections()
	return errors.Join(errs...)
}

// httpRegistration renews its entry every TTL/3 until withdrawn.
type httpRegistration struct {
	r          *httpRegistry
	w          Worker
	body       []byte
	once       sync.Once
	stop, done chan struct{}
}

func (g *httpRegistration) put(ctx context.Context) error {
	path := fmt.Sprintf("%s/%s?ttl=%d", WorkersPath, g.w.Name, int(g.r.cfg.TTL/time.Second))
	return g.r.do(ctx, http.MethodPut, path, g.body, nil)
}

func (g *httpRegistration) heartbeat() {
	defer close(g.done)
	t := time.NewTicker(g.r.cfg.TTL / 3)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), attempt)
		if err := g.put(ctx); err != nil {
			g.r.cfg.Logger.Warn("renewing the registry entry failed", zap.String("worker", g.w.Name), zap.Error(err))
		}
		cancel()
	}
}

// Withdraw implements Registration.
func (g *httpRegistration) Withdraw(ctx context.Context) error {
	g.r.mu.Lock()
	delete(g.r.regs, g)
	g.r.mu.Unlock()
	return g.withdraw(ctx)
}

func (g *httpRegistration) withdraw(ctx context.Context) error {
	var err error
	g.once.Do(func() {
		close(g.stop)
		<-g.done
		path := fmt.Sprintf("%s/%s?incarnation=%d", WorkersPath, g.w.Name, g.w.Incarnation)
		if derr := g.r.do(ctx, http.MethodDelete, path, nil, nil); derr != nil {
			err = fmt.Errorf("kvxfer/discovery: withdrawing %s: %w (its entry ends with its ttl)", g.w.Name, derr)
		}
	})
	return err
}

// abandon stops renewing without withdrawing, as a worker that dies does. Tests only.
func (g *httpRegistration) abandon() {
	g.once.Do(func() {
		close(g.stop)
		<-g.done
	})
}
