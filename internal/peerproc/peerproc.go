// SPDX-License-Identifier: Apache-2.0

// Package peerproc runs the second UCX process of the two-process tests (native/internal/ucxpeer
// for native/'s, transfer/internal/enginepeer for transfer's engines) and speaks their line
// protocol: the peer prints "ADDR <hex>" first, takes "PEER <hex>" on its stdin, and reports
// with lines like "GOT <n>", "DONE <...>" and "ERR <...>". It is for tests only: every call
// takes the test and fails it on error.
package peerproc

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Build builds ucxpeer into the calling test's temporary directory, removed when that test
// ends. Call it from the top-level test and pass the path to its subtests: one build per test.
func Build(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ucxpeer")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/kvxfer/kvxfer/native/internal/ucxpeer").CombinedOutput()
	require.NoError(t, err, "go build ucxpeer:\n%s", out)
	return bin
}

// BuildEnginePeer builds transfer/internal/enginepeer, the engine-over-UCX peer of transfer's
// two-process tests (it speaks the same protocol), as Build builds ucxpeer.
func BuildEnginePeer(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "enginepeer")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/kvxfer/kvxfer/transfer/internal/enginepeer").CombinedOutput()
	require.NoError(t, err, "go build enginepeer:\n%s", out)
	return bin
}

// Proc is a running peer. The test's cleanup continues and kills it and waits (bounded) for it
// to be reaped: a killed peer must not linger as a zombie that UCX still sees as alive.
type Proc struct {
	Cmd *exec.Cmd
	// Addr is the peer's UCX worker address, hex-encoded, from its ADDR line.
	Addr   string
	stdin  io.WriteCloser
	lines  chan string // stdout, line by line; closed at EOF
	exited chan struct{}
}

// Start starts bin with args and waits up to 20 s for its address.
func Start(t testing.TB, bin string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &Proc{Cmd: cmd, stdin: stdin, lines: make(chan string, 1<<16), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default: // progress lines nobody reads are dropped: the peer must never block on us
			}
		}
		close(p.lines)
		_ = cmd.Wait() // after the last read of stdout, as exec requires
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = stdin.Close()
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("ucxpeer %d did not exit", cmd.Process.Pid)
		}
	})
	p.Addr = p.Expect(t, "ADDR ", 20*time.Second)
	return p
}

// Expect waits up to d for the next line with prefix and returns the rest of it. Lines with
// other prefixes are skipped, except "ERR ", which fails the test, as does the peer's exit.
func (p *Proc) Expect(t testing.TB, prefix string, d time.Duration) string {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case line, ok := <-p.lines:
			require.True(t, ok, "ucxpeer exited while %q was expected", prefix)
			if rest, found := strings.CutPrefix(line, prefix); found {
				return rest
			}
			require.False(t, strings.HasPrefix(line, "ERR "), "ucxpeer: %s", line)
		case <-deadline:
			require.FailNow(t, "timeout", "no %q line from ucxpeer within %v", prefix, d)
		}
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
	_, err := fmt.Fprintf(p.stdin, "PEER %s\n", addr)
	require.NoError(t, err)
}

// Signal sends sig to the peer.
func (p *Proc) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.Cmd.Process.Signal(sig))
}
