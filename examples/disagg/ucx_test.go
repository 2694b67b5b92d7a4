// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// skipWithoutUCX skips when this build has no UCX transport: it needs cgo (and libucx),
// the one thing a test here may lack.
func skipWithoutUCX(t *testing.T) {
	t.Helper()
	if newUCXFabric == nil {
		t.Skip("the UCX transport is not built: it needs cgo (CGO_ENABLED=1 and libucx-dev)")
	}
}

// requireReaped fails unless no process has pid any more: the decode process was waited for.
func requireReaped(t *testing.T, pid int) {
	t.Helper()
	require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "process %d still exists (running or a zombie)", pid)
}

// syncBuffer is a bytes.Buffer two goroutines may write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// decodeStoryLines are what the decode side prints about its blocks over UCX, 100 tokens a
// request (7 blocks of 256 KiB).
var decodeStoryLines = []string{
	`(?m)^decode: request 1: ContextParams \(\d+ bytes\) from (?:[a-z]+-\d+/)?peer-[0-9a-f]{12}: prefill blocks \[0 1 2 3 4 5 6\]$`,
	`(?m)^decode: request 1: completed, 1835008 bytes from (?:[a-z]+-\d+/)?peer-[0-9a-f]{12} into blocks \[0 1 2 3 4 5 6\] in [^,]+, path rma$`, // registered pools: the one-copy path
	`(?m)^decode: request 1: all 1835008 bytes verified; blocks ready for generation$`,
	`(?m)^decode: request 2: client went away before its KV moved; prefill's cancel said cancelled-before-advertise$`,
	`(?m)^decode: request 3: cancel: cancel-requested-in-flight: stop scheduling it; blocks \[\d[ \d]*\] wait for Quiesced$`,
	`(?m)^decode: request 3: quiesced \(cancelled\); blocks \[\d[ \d]*\] freed$`,
	`(?m)^decode: health: ok$`,
	`(?m)^metrics: decode received 1835008 bytes$`,
	`(?m)^KV blocks free: decode 64 of 64$`,
}

// prefillStoryLines are what the prefill side prints about its blocks over UCX.
var prefillStoryLines = []string{
	`(?m)^control plane: http://127\.0\.0\.1:\d+ `,
	`(?m)^prefill: request 1: 100 tokens in blocks \[0 1 2 3 4 5 6\], 1835008 bytes offered to (?:[a-z]+-\d+/)?peer-[0-9a-f]{12}$`,
	`(?m)^prefill: request 1: completed \(1835008 of 1835008 bytes\); blocks \[0 1 2 3 4 5 6\] freed$`,
	`(?m)^prefill: request 2: abort: cancelled-before-advertise: blocks \[\d[ \d]*\] freed at once$`,
	`(?m)^prefill: decode worker (?:[a-z]+-\d+/)?peer-[0-9a-f]{12} says it is done$`,
	`(?m)^healthz: 200 ok$`,
	`(?m)^metrics: prefill sent 1835008 bytes$`,
	`(?m)^KV blocks free: prefill 64 of 64$`,
}

// TestDisagg_UCXTwoProcesses runs the default mode as a user would (go run ./examples/disagg):
// this process is prefill and starts the decode process from its own binary (here the test
// binary, which TestMain turns into the command). Both processes' lines must be there, from
// two different pids, and the decode process must have been reaped.
func TestDisagg_UCXTwoProcesses(t *testing.T) {
	skipWithoutUCX(t)
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, run(ctx, append([]string{"-tokens=100"}, patientStory...), &stdout, &stderr), "stdout: %s\nstderr: %s", stdout.String(), stderr.String())
	out := stdout.String()
	for _, want := range append(append([]string{}, prefillStoryLines...), decodeStoryLines...) {
		require.Regexp(t, regexp.MustCompile(want), out)
	}
	// The decode looked prefill-0 up in the registry: it names that peer so in what it prints.
	require.Regexp(t, regexp.MustCompile(`(?m)^decode: request 1: ContextParams \(\d+ bytes\) from prefill-0/peer-[0-9a-f]{12}: `), out)
	prefillPid := regexp.MustCompile(`(?m)^prefill: pid (\d+), engine (?:[a-z]+-\d+/)?peer-[0-9a-f]{12} over UCX \(posix,cma,self\)$`).FindStringSubmatch(out)
	decodePid := regexp.MustCompile(`(?m)^decode: pid (\d+), engine (?:[a-z]+-\d+/)?peer-[0-9a-f]{12} over UCX \(posix,cma,self\), prefill's control plane http://127\.0\.0\.1:\d+$`).FindStringSubmatch(out)
	require.NotNil(t, prefillPid, out)
	require.NotNil(t, decodePid, out)
	require.Equal(t, strconv.Itoa(os.Getpid()), prefillPid[1], "prefill runs in the process the user started")
	require.NotEqual(t, prefillPid[1], decodePid[1], "decode runs in a second process")
	require.Regexp(t, `(?m)^prefill: decode process \(pid `+decodePid[1]+`\) exited: ok$`, out)
	pid, err := strconv.Atoi(decodePid[1])
	require.NoError(t, err)
	requireReaped(t, pid)
	require.NotContains(t, out, "never quiesced")
}

// TestDisagg_UCXRolesByHand runs -role=prefill and -role=decode as two terminals would (here
// both in this process, each with its own UCX worker): the decode role reaches the prefill
// role only through -control, and the prefill role reports once the decode role says it is
// done.
func TestDisagg_UCXRolesByHand(t *testing.T) {
	skipWithoutUCX(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // free again for the prefill role; a race with another listener fails loudly

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var prefillOut, prefillErr syncBuffer
	prefillDone := make(chan error, 1)
	go func() {
		prefillDone <- run(ctx, append([]string{"-role=prefill", "-control=" + addr}, patientStory...), &prefillOut, &prefillErr)
	}()
	// The decode role starts once the prefill role says it waits for one (its control plane
	// listens and it is in the registry), as a person at the second terminal would: a count of
	// tries bounded by time ran out before a loaded host had the prefill role listening.
	waiting := "prefill: waiting for a decode process: go run ./examples/disagg -role=decode -control=" + addr
	for !strings.Contains(prefillOut.String(), waiting) {
		select {
		case err := <-prefillDone:
			t.Fatalf("the prefill role ended before it waited for a decode process: %v\nstdout: %s\nstderr: %s",
				err, prefillOut.String(), prefillErr.String())
		case <-ctx.Done():
			t.Fatalf("the prefill role never waited for a decode process: %s", prefillOut.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	var decodeOut, decodeErr bytes.Buffer
	decodeRunErr := run(ctx, append([]string{"-role=decode", "-control=" + addr}, patientStory...), &decodeOut, &decodeErr)
	require.NoError(t, decodeRunErr, "decode stdout: %s\nstderr: %s", decodeOut.String(), decodeErr.String())
	select {
	case err := <-prefillDone:
		require.NoError(t, err, "prefill stdout: %s\nstderr: %s", prefillOut.String(), prefillErr.String())
	case <-ctx.Done():
		t.Fatalf("the prefill role never finished: %s", prefillOut.String())
	}
	for _, want := range decodeStoryLines {
		require.Regexp(t, regexp.MustCompile(want), decodeOut.String())
	}
	for _, want := range prefillStoryLines {
		require.Regexp(t, regexp.MustCompile(want), prefillOut.String())
	}
	require.Contains(t, prefillOut.String(), "prefill: waiting for a decode process: go run ./examples/disagg -role=decode -control="+addr)
	require.NotContains(t, decodeOut.String(), "prefill:", "each process prints only its own side")
}

// TestDisagg_DecodeProcessIsAlwaysReaped checks the prefill process's bounded stop: a child
// that exits on the interrupt, and one that ignores it and is killed, are both reaped, and a
// child that had exited by itself is left alone.
func TestDisagg_DecodeProcessIsAlwaysReaped(t *testing.T) {
	cases := []struct {
		desc   string
		script string
		want   string // in stop's error; "" for none
	}{
		// exec, so the signals reach sleep itself and nothing is left behind; an ignored
		// signal stays ignored across exec.
		{"exits on the interrupt", "exec sleep 30", "interrupted"},
		{"ignores the interrupt, so is killed", `trap "" INT; exec sleep 30`, "killed after ignoring an interrupt"},
		{"already exited", "exit 0", ""},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			p, err := startProcess(exec.Command("/bin/sh", "-c", c.script))
			require.NoError(t, err)
			p.interruptGrace, p.reapBound = 300*time.Millisecond, 5*time.Second
			bound := 200 * time.Millisecond
			if c.want == "" {
				bound = 5 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			if c.want == "" {
				require.NoError(t, p.wait(ctx.Done()))
			} else {
				require.Error(t, p.wait(ctx.Done()), "the child should still be running")
			}
			began := time.Now()
			err = p.stop()
			if c.want == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, c.want)
			}
			require.Less(t, time.Since(began), p.interruptGrace+p.reapBound, "stop is bounded")
			requireReaped(t, p.pid())
		})
	}
}

// TestDisagg_PrefillReapsAFailedOrHungDecodeProcess stands a shell script in for the decode
// process: one that fails must fail the run, and one that hangs and ignores the interrupt
// must be killed once -timeout passes; either way it is reaped before run returns.
func TestDisagg_PrefillReapsAFailedOrHungDecodeProcess(t *testing.T) {
	skipWithoutUCX(t)
	cases := []struct {
		desc    string
		script  string
		timeout string
		want    []string
	}{
		{"exits with an error", "exit 3", "20s", []string{"exit status 3"}},
		{"exits without saying it is done", "exit 0", "20s", []string{"exited without saying it was done"}},
		{"hangs and ignores the interrupt", `trap "" INT; exec sleep 30`, "1s", []string{"still running", "killed after ignoring an interrupt"}},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			script := filepath.Join(t.TempDir(), "decode.sh")
			require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\n"+c.script+"\n"), 0o755))
			oldExe, oldGrace := decodeExecutable, childInterruptGrace
			decodeExecutable = func() (string, error) { return script, nil }
			childInterruptGrace = 300 * time.Millisecond
			t.Cleanup(func() { decodeExecutable, childInterruptGrace = oldExe, oldGrace })

			var stdout, stderr bytes.Buffer
			began := time.Now()
			err := run(t.Context(), []string{"-timeout=" + c.timeout}, &stdout, &stderr)
			require.Error(t, err, "stdout: %s", stdout.String())
			for _, want := range c.want {
				require.ErrorContains(t, err, want)
			}
			require.Less(t, time.Since(began), 15*time.Second, "bounded by -timeout and the reaping bounds")
			m := regexp.MustCompile(`(?m)^prefill: started the decode process, pid (\d+)$`).FindStringSubmatch(stdout.String())
			require.NotNil(t, m, stdout.String())
			pid, err := strconv.Atoi(m[1])
			require.NoError(t, err)
			requireReaped(t, pid)
		})
	}
}
