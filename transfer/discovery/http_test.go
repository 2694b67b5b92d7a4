// SPDX-License-Identifier: Apache-2.0

package discovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/transfer/discovery/internal/retry"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
	"github.com/stretchr/testify/require"
)

// testRegistry is the embedded registry on a test server (internal/registryserver, which
// kvxbench starts, imports this package).
type testRegistry struct{ srv *httptest.Server }

func (r testRegistry) URL() string { return r.srv.URL }

func (r testRegistry) Close(context.Context) error {
	r.srv.Close()
	return nil
}

func serveRegistry(t *testing.T) testRegistry {
	t.Helper()
	mux, h := http.NewServeMux(), Handler()
	mux.Handle(WorkersPath, h)
	mux.Handle(WorkersPath+"/", h)
	r := testRegistry{srv: httptest.NewServer(mux)}
	t.Cleanup(r.srv.Close)
	return r
}

func openHTTP(t *testing.T, url string, cfg Config) Registry {
	t.Helper()
	r, err := Open(url, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// The embedded registry keeps the etcd backend's promises: lookups and lists, a dead worker
// gone within its TTL, a restart seen as a new incarnation, a withdraw that removes only its
// own incarnation.
func TestHTTP_Lifecycle(t *testing.T) {
	srv := serveRegistry(t)
	const ttl = 6 * time.Second // renewed every TTL/3: room for a loaded host (2 s lost the entry in a 2 s stall)
	ctx := t.Context()
	pub := openHTTP(t, srv.URL(), Config{TTL: ttl})
	look := openHTTP(t, srv.URL(), Config{TTL: ttl})

	p1 := worker("prefill-0", "prefill", 1)
	reg, err := pub.Publish(ctx, p1)
	require.NoError(t, err)
	_, err = pub.Publish(ctx, worker("decode-0", "decode", 5))
	require.NoError(t, err)
	got, err := look.Lookup(ctx, "prefill-0")
	require.NoError(t, err)
	require.Equal(t, p1, got)
	ws, err := look.List(ctx, "prefill")
	require.NoError(t, err)
	require.Equal(t, []Worker{p1}, ws)
	ws, err = look.List(ctx, "")
	require.NoError(t, err)
	require.Len(t, ws, 2)
	_, err = look.Lookup(ctx, "nobody")
	require.ErrorIs(t, err, ErrNotFound)

	for start := time.Now(); time.Since(start) < 2*ttl; time.Sleep(100 * time.Millisecond) {
		_, err = look.Lookup(ctx, "prefill-0")
		require.NoError(t, err, "renewed: a live worker outlives its TTL")
	}

	// Killed, then restarted before its entry ran out: the new life replaces it, params of
	// the old one are stale, and the old life's late withdraw removes nothing.
	reg.(*httpRegistration).abandon()
	restarted := openHTTP(t, srv.URL(), Config{TTL: ttl})
	reg2, err := restarted.Publish(ctx, worker("prefill-0", "prefill", 2))
	require.NoError(t, err)
	err = CheckParams(ctx, look, "prefill-0", &ucx.ContextParams{Incarnation: 1, WorkerAddress: p1.Address}, nil)
	require.ErrorIs(t, err, ucx.ErrStaleIncarnation)
	require.NoError(t, pub.(checked).Registry.(*httpRegistry).do(ctx, http.MethodDelete, WorkersPath+"/prefill-0?incarnation=1", nil, nil))
	got, err = look.Lookup(ctx, "prefill-0")
	require.NoError(t, err)
	require.Equal(t, uint64(2), got.Incarnation)

	// The new life dies: gone within the TTL.
	died := time.Now()
	reg2.(*httpRegistration).abandon()
	require.Eventually(t, func() bool {
		_, err := look.Lookup(ctx, "prefill-0")
		return errors.Is(err, ErrNotFound)
	}, waitBound, 20*time.Millisecond)
	require.Less(t, time.Since(died), ttl+3*time.Second)
	err = CheckParams(ctx, look, "prefill-0", &ucx.ContextParams{Incarnation: 2, WorkerAddress: got.Address}, nil)
	require.ErrorIs(t, err, ucx.ErrStaleIncarnation)
}

// A registry that is gone: lookups fail with ErrUnavailable after bounded retries.
func TestHTTP_Unreachable(t *testing.T) {
	srv := serveRegistry(t)
	url := srv.URL()
	const bound = 200 * time.Millisecond
	r := openHTTP(t, url, Config{TTL: time.Second, LookupTimeout: bound})
	require.NoError(t, srv.Close(t.Context()))
	_, err := r.Lookup(t.Context(), "prefill-0")
	require.ErrorIs(t, err, ErrUnavailable)
	var ue *retry.UnavailableError
	require.ErrorAs(t, err, &ue)
	require.Greater(t, ue.Attempts, 1)
	_, err = r.Publish(t.Context(), worker("prefill-0", "prefill", 1))
	require.ErrorIs(t, err, ErrUnavailable)
}

// Bad requests to the registry are refused with 400 and change nothing.
func TestHTTP_HandlerRefusesBadInput(t *testing.T) {
	srv := serveRegistry(t)
	r := openHTTP(t, srv.URL(), Config{TTL: time.Second}).(checked).Registry.(*httpRegistry)
	ctx := t.Context()
	cases := []struct{ method, path, body string }{
		{http.MethodPut, WorkersPath + "/a?ttl=1", "{not json"},
		{http.MethodPut, WorkersPath + "/a?ttl=1", `{"name":"b","role":"prefill","incarnation":1}`},
		{http.MethodPut, WorkersPath + "/a?ttl=0", `{"name":"a","role":"prefill","incarnation":1}`},
		{http.MethodPut, WorkersPath + "/a?ttl=1", `{"name":"a","role":"prefill","incarnation":0}`},
		{http.MethodPut, WorkersPath + "/a?ttl=1", `{"name":"a","role":"prefill","incarnation":1,"x":"` + strings.Repeat("x", maxEntryBytes) + `"}`},
		{http.MethodDelete, WorkersPath + "/a?incarnation=x", ""},
		{http.MethodGet, WorkersPath + "/a%2Fb", ""},
	}
	for _, c := range cases {
		err := r.do(ctx, c.method, c.path, []byte(c.body), nil)
		require.ErrorIs(t, err, ErrInvalid, "%s %s", c.method, c.path)
	}
	ws, err := r.List(ctx, "")
	require.NoError(t, err)
	require.Empty(t, ws)
}

// A registry entry is input: a 200 KiB field in it is refused with an error that quotes a
// bounded part of it, once, not the whole field.
func TestLookupBoundsWhatAnErrorQuotesFromTheRegistry(t *testing.T) {
	huge := strings.Repeat("r", 200<<10)
	cases := []struct {
		desc  string
		entry string
	}{
		{"a huge role", fmt.Sprintf(`{"name":"w","role":%q,"incarnation":1}`, huge)},
		{"a huge name in the body", fmt.Sprintf(`{"name":%q,"role":"prefill","incarnation":1}`, huge)},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.WriteString(w, c.entry)
			}))
			defer srv.Close()
			reg, err := Open(srv.URL, Config{LookupTimeout: 2 * time.Second})
			require.NoError(t, err)
			defer reg.Close()
			_, err = reg.Lookup(context.Background(), "w")
			require.ErrorIs(t, err, ErrInvalid)
			require.Less(t, len(err.Error()), 512, "the error quotes a bounded part of the entry")
		})
	}
}

// waitBound bounds every wait here.
const waitBound = 15 * time.Second

func worker(name, role string, inc uint64) Worker {
	return Worker{Name: name, Role: role, Incarnation: inc, Address: []byte("ucx-" + name + fmt.Sprint(inc)),
		Endpoints: map[string]string{"control": "127.0.0.1:7400"}, Protocol: Protocol{Version: 1, Features: []string{"rma"}}}
}

// Open refuses targets it cannot use, naming them.
func TestOpen_BadTargets(t *testing.T) {
	for _, target := range []string{"", "etcd://", "redis://x:1", "http://", "::"} {
		_, err := Open(target, Config{})
		require.ErrorIs(t, err, ErrInvalid, target)
	}
	_, err := Open("http://127.0.0.1:1", Config{TTL: 10 * time.Millisecond})
	require.ErrorIs(t, err, ErrInvalid)
}

// A program that uses only the embedded HTTP registry links no etcd client: the etcd backend
// is a package of its own, linked by importing it.
func TestHTTPRegistryLinksNoEtcd(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to list the package's dependencies")
	}
	out, err := exec.Command(gobin, "list", "-deps", "github.com/kvxfer/kvxfer/transfer/discovery").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NotContains(t, string(out), "go.etcd.io/", "package discovery depends on etcd")
	_, err = Open("etcd://127.0.0.1:2379/x", Config{})
	require.ErrorIs(t, err, ErrInvalid)
	require.Contains(t, err.Error(), `import _ "github.com/kvxfer/kvxfer/transfer/discovery/etcd"`)
}

// WaitFor finds a worker that publishes after the wait began, and fails typed, bounded by its
// context, for one that never does; Publish fills in the build's protocol.
func TestWaitForAndTheFilledProtocol(t *testing.T) {
	srv := serveRegistry(t)
	pub := openHTTP(t, srv.URL(), Config{TTL: time.Second})
	look := openHTTP(t, srv.URL(), Config{})
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	found := make(chan error, 1)
	go func() {
		w, err := WaitFor(ctx, look, "late-0")
		if err == nil && w.Protocol.Version != BuildProtocol().Version {
			err = fmt.Errorf("protocol %+v, want the build's", w.Protocol)
		}
		found <- err
	}()
	time.Sleep(100 * time.Millisecond) // let the wait start before the name exists (either order passes)
	_, err := pub.Publish(ctx, Worker{Name: "late-0", Role: "prefill", Incarnation: 1})
	require.NoError(t, err)
	require.NoError(t, <-found)

	short, cancelShort := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancelShort()
	_, err = WaitFor(short, look, "never-0")
	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}
