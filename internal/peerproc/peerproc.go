// SPDX-License-Identifier: Apache-2.0

// Package peerproc runs the second UCX process of the two-process tests (native/internal/ucxpeer
// for native/'s, transfer/internal/enginepeer for transfer's engines) and speaks their line
// protocol: the peer prints "ADDR <hex>" first, takes "PEER <hex>" on its stdin, and reports
// with lines like "GOT <n>", "DONE <...>" and "ERR <...>". It is for tests only: every call
// takes the test and fails it on error.
//
// Its core, package peerproc/proc, is the one harness for every child process kvxfer starts,
// in tests or not: start it, read its lines, kill it (with its process group) and reap it,
// each wait bounded. kvxbench's peers and baseline and the stress soak's peers use it directly.
package peerproc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/peerproc/proc"
)

// UCXPeerEnv and EnginePeerEnv name prebuilt peers that Build and BuildEnginePeer return
// instead of building them: a host without Go (the GPU machine, which runs the test binaries of
// the GPU bundle, scripts/gpu-run.sh) runs the two-process tests with peers built elsewhere,
// against the same UCX. The value must be an absolute path to an executable file.
const (
	UCXPeerEnv    = "KVX_UCXPEER_BIN"
	EnginePeerEnv = "KVX_ENGINEPEER_BIN"
	// HostilePeerEnv names a prebuilt transfer/internal/hostilepeer (BuildHostilePeer).
	HostilePeerEnv = "KVX_HOSTILEPEER_BIN"
)

// Build builds ucxpeer into the calling test's temporary directory, removed when that test
// ends (or once for the test binary, under SharedBuilds), or returns the prebuilt one
// $KVX_UCXPEER_BIN names. Call it from the top-level test and pass the path to its subtests:
// one build per test.
func Build(t testing.TB) string {
	t.Helper()
	return buildPeer(t, UCXPeerEnv, "ucxpeer", "github.com/kvxfer/kvxfer/native/internal/ucxpeer")
}

// BuildEnginePeer builds transfer/internal/enginepeer, the engine-over-UCX peer of transfer's
// two-process tests (it speaks the same protocol), as Build builds ucxpeer; $KVX_ENGINEPEER_BIN
// names a prebuilt one.
func BuildEnginePeer(t testing.TB) string {
	t.Helper()
	return buildPeer(t, EnginePeerEnv, "enginepeer", "github.com/kvxfer/kvxfer/transfer/internal/enginepeer")
}

// BuildHostilePeer builds transfer/internal/hostilepeer, the lying peer of the hostile peer
// harness (internal/hostile), as Build builds ucxpeer; $KVX_HOSTILEPEER_BIN names a prebuilt
// one.
func BuildHostilePeer(t testing.TB) string {
	t.Helper()
	return buildPeer(t, HostilePeerEnv, "hostilepeer", "github.com/kvxfer/kvxfer/transfer/internal/hostilepeer")
}

func buildPeer(t testing.TB, env, name, pkg string) string {
	t.Helper()
	bin, err := prebuiltPeer(env)
	require.NoError(t, err)
	if bin != "" {
		return bin
	}
	shared.Lock()
	defer shared.Unlock()
	if b, ok := shared.built[pkg]; ok {
		return b
	}
	if shared.built != nil && shared.dir == "" { // the binary's first build makes the directory
		if dir, err := os.MkdirTemp("", "kvxfer-peers-"); err == nil {
			shared.dir = dir
		}
	}
	dir := shared.dir
	if dir == "" {
		dir = t.TempDir()
	}
	bin = filepath.Join(dir, name)
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	require.NoError(t, err, "go build %s:\n%s", name, out)
	if shared.dir != "" {
		shared.built[pkg] = bin
	}
	return bin
}

// shared holds the peers built once for a whole test binary (SharedBuilds).
var shared struct {
	sync.Mutex
	dir   string            // "" until SharedBuilds' first build
	built map[string]string // package path to binary; nil unless SharedBuilds runs
}

// SharedBuilds wraps a TestMain's m (goleak.VerifyTestMain(peerproc.SharedBuilds(m)), or
// os.Exit(peerproc.SharedBuilds(m).Run())): while it runs, Build, BuildEnginePeer and
// BuildHostilePeer build each peer once for the test binary, not once per test (a link of a
// cgo binary takes seconds), and it removes them when m.Run returns. Their directory is made
// at the first build: a test binary that builds none (the child a test re-runs itself as, often
// killed or ended by os.Exit, which skips the removal) leaves nothing in $TMPDIR.
func SharedBuilds(m interface{ Run() int }) interface{ Run() int } { return sharedBuilds{m} }

type sharedBuilds struct{ m interface{ Run() int } }

func (s sharedBuilds) Run() int {
	shared.Lock()
	shared.dir, shared.built = "", map[string]string{}
	shared.Unlock()
	defer func() {
		shared.Lock()
		if shared.dir != "" {
			_ = os.RemoveAll(shared.dir)
		}
		shared.dir, shared.built = "", nil
		shared.Unlock()
	}()
	return s.m.Run()
}

// prebuiltPeer returns the peer the environment variable env names, or "" when it is unset. A
// value that cannot be run is an error, never a silent fallback to building: the host that
// sets it may have no Go.
func prebuiltPeer(env string) (string, error) {
	bin := os.Getenv(env)
	if bin == "" {
		return "", nil
	}
	if !filepath.IsAbs(bin) { // the tests run in their package directories
		return "", fmt.Errorf("%s=%s: not an absolute path", env, bin)
	}
	info, err := os.Stat(bin)
	if err != nil {
		return "", fmt.Errorf("%s=%s: %w", env, bin, err)
	}
	if !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("%s=%s: not an executable file (%v)", env, bin, info.Mode())
	}
	return bin, nil
}

// Proc is a running peer. The test's cleanup continues and kills it and waits (bounded) for it
// to be reaped: a killed peer must not linger as a zombie that UCX still sees as alive.
type Proc struct {
	Cmd *exec.Cmd
	// Addr is the peer's UCX worker address, hex-encoded, from its ADDR line.
	Addr  string
	child *proc.Child
	lines chan string // stdout, line by line; complete once child.Exited is closed
}

// Start starts bin with args and waits up to 20 s for its address.
func Start(t testing.TB, bin string, args ...string) *Proc {
	t.Helper()
	p := start(t, bin, args...)
	p.Addr = p.Expect(t, "ADDR ", 20*time.Second)
	return p
}

// StartServing starts an enginepeer (BuildEnginePeer) with -serve and args, and waits up to 20 s
// for it to say it is ready: it then runs one engine per Run, in the one process, so a test
// that walks every path spends one process per transport, not one per path.
func StartServing(t testing.TB, bin string, args ...string) *Proc {
	t.Helper()
	p := start(t, bin, append([]string{"-serve"}, args...)...)
	p.Expect(t, "READY", 20*time.Second)
	return p
}

// Run starts an engine in a serving peer with args (enginepeer's flags, over those it was
// started with), sets Addr to its address and returns it. Connect then tells it this side's;
// CloseRun ends it.
func (p *Proc) Run(t testing.TB, args ...string) string {
	t.Helper()
	require.NoError(t, p.child.Send("RUN "+strings.Join(args, " ")))
	p.Addr = p.Expect(t, "ADDR ", 30*time.Second)
	return p.Addr
}

// CloseRun closes the engine Run started, once its requests ended, and waits up to d for it.
func (p *Proc) CloseRun(t testing.TB, d time.Duration) {
	t.Helper()
	require.NoError(t, p.child.Send("CLOSE"))
	p.Expect(t, "CLOSED", d)
}

func start(t testing.TB, bin string, args ...string) *Proc {
	t.Helper()
	p := &Proc{lines: make(chan string, 1<<16)}
	child, err := proc.Start(context.Background(), exec.Command(bin, args...), proc.Options{
		Stdin: true, Stderr: os.Stderr,
		Lines: func(line string) {
			select {
			case p.lines <- line:
			default: // progress lines nobody reads are dropped: the peer must never block on us
			}
		}})
	require.NoError(t, err)
	p.Cmd, p.child = child.Cmd, child
	t.Cleanup(func() {
		child.Kill()
		_ = child.CloseStdin()
		if !child.Reap(10 * time.Second) {
			t.Errorf("%s %d did not exit", filepath.Base(bin), child.Pid())
		}
	})
	return p
}

// nextLine returns the next line the peer printed, or false once it has exited and every line
// it printed has been read.
func (p *Proc) nextLine(deadline <-chan time.Time) (line string, ok, timedOut bool) {
	select {
	case line := <-p.lines:
		return line, true, false
	case <-p.child.Exited():
		select { // every line is in the channel once the child is reaped
		case line := <-p.lines:
			return line, true, false
		default:
			return "", false, false
		}
	case <-deadline:
		return "", false, true
	}
}

// Expect waits up to d for the next line with prefix and returns the rest of it. Lines with
// other prefixes are skipped, except "ERR ", which fails the test, as does the peer's exit.
func (p *Proc) Expect(t testing.TB, prefix string, d time.Duration) string {
	t.Helper()
	deadline := time.After(d)
	for {
		line, ok, timedOut := p.nextLine(deadline)
		require.False(t, timedOut, "no %q line from the peer within %v", prefix, d)
		require.True(t, ok, "the peer exited while %q was expected", prefix)
		if rest, found := strings.CutPrefix(line, prefix); found {
			return rest
		}
		require.False(t, strings.HasPrefix(line, "ERR "), "peer: %s", line)
	}
}

// WaitGot waits up to d until the peer reports chunk n or a later one done.
func (p *Proc) WaitGot(t testing.TB, n int, d time.Duration) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		i, err := strconv.Atoi(p.Expect(t, "GOT ", time.Until(end)))
		require.NoError(t, err)
		if i >= n {
			return
		}
	}
	require.FailNow(t, "timeout", "ucxpeer did not reach chunk %d within %v", n, d)
}

// Connect tells the peer the address (hex) of this process's worker.
func (p *Proc) Connect(t testing.TB, addr string) {
	t.Helper()
	require.NoError(t, p.child.Send("PEER "+addr))
}

// Signal sends sig to the peer.
func (p *Proc) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.child.Signal(sig))
}
