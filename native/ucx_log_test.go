// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// UCX's own log lines reach the engine's zap logger (named "ucx", UCX's level and source as
// fields), not stderr; a no-op logger leaves UCX printing them itself; a closed Context's
// logger hears no more.
func TestUCXLogLinesGoThroughTheContextsLogger(t *testing.T) {
	core, seen := observer.New(zapcore.DebugLevel)
	ctx, err := NewContext(ContextConfig{TLS: "self", Logger: zap.New(core)})
	require.NoError(t, err)
	quiet, err := NewContext(ContextConfig{TLS: "self"}) // no-op logger: not routed
	require.NoError(t, err)
	defer func() { require.NoError(t, quiet.Close()) }()

	ucxWarnForTest("kvxfer log test: first")
	flushUCXLog()
	lines := seen.FilterMessage("kvxfer log test: first").All()
	require.Len(t, lines, 1, "the line went through UCX's dispatch to the logger, once")
	require.Equal(t, zapcore.WarnLevel, lines[0].Level)
	require.Equal(t, "ucx", lines[0].LoggerName)
	require.Equal(t, "WARN", lines[0].ContextMap()["ucx_level"])
	require.Contains(t, lines[0].ContextMap()["at"], "ucx_log.go:", "names UCX's source file and line")

	require.NoError(t, ctx.Close())
	ucxWarnForTest("kvxfer log test: after close")
	flushUCXLog()
	require.Empty(t, seen.FilterMessage("kvxfer log test: after close").All(), "a closed context's logger hears nothing more")
}

// gatedCore is a zap core whose writes wait until gate is closed: a logger that blocks.
type gatedCore struct {
	zapcore.Core
	gate <-chan struct{}
}

func (c gatedCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c gatedCore) Write(e zapcore.Entry, f []zapcore.Field) error {
	<-c.gate
	return c.Core.Write(e, f)
}

func (c gatedCore) With(f []zapcore.Field) zapcore.Core {
	return gatedCore{Core: c.Core.With(f), gate: c.gate}
}

// UCX logs from its own threads (its async thread, a worker's progress): a logger that blocks
// never blocks them. Lines past the queue are dropped and their number logged; every line
// is either logged, in UCX's order, or counted.
func TestUCXLog_ABlockedLoggerNeverBlocksUCX(t *testing.T) {
	core, seen := observer.New(zapcore.DebugLevel)
	gate := make(chan struct{})
	ctx, err := NewContext(ContextConfig{TLS: "self", Logger: zap.New(gatedCore{Core: core, gate: gate})})
	require.NoError(t, err)

	const n = ucxLogQueueForTest + 50
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		for i := 0; i < n; i++ {
			ucxWarnForTest(fmt.Sprintf("kvxfer log test: flood %d", i))
		}
	}()
	select {
	case <-logged:
		close(gate)
	case <-time.After(60 * time.Second):
		close(gate)
		<-logged
		t.Fatal("UCX's log call waited on a blocked logger")
	}
	require.NoError(t, ctx.Close(), "Close drains what UCX logged")

	var dropped uint64
	for _, e := range seen.FilterMessageSnippet("UCX log lines dropped").All() {
		dropped += e.ContextMap()["dropped"].(uint64)
	}
	got := seen.FilterMessageSnippet("kvxfer log test: flood").All()
	require.Positive(t, dropped, "more lines than the queue holds, with the logger blocked")
	require.Equal(t, n, len(got)+int(dropped), "every line logged or counted")
	last := -1
	for _, e := range got {
		var i int
		_, err := fmt.Sscanf(e.Message, "kvxfer log test: flood %d", &i)
		require.NoError(t, err)
		require.Greater(t, i, last, "in UCX's order")
		last = i
	}
}

const (
	ucxLogChildEnv = "KVX_UCX_LOG_CHILD" // the TLS the child connects over
	ucxLogDeadEnv  = "KVX_UCX_LOG_DEAD"  // the dead worker's address, hex
)

// TestUCXLogChild is the child of TestUCXLog_DeadPeerLinesReachTheLoggerNotStderr: with a
// real logger, it connects to a dead worker's address, sends if UCX let it connect, and
// prints every line its logger heard from UCX.
func TestUCXLogChild(t *testing.T) {
	tls, ok := os.LookupEnv(ucxLogChildEnv)
	if !ok {
		t.Skip("run by TestUCXLog_DeadPeerLinesReachTheLoggerNotStderr only")
	}
	addr, err := hex.DecodeString(os.Getenv(ucxLogDeadEnv))
	require.NoError(t, err)
	core, seen := observer.New(zapcore.DebugLevel)
	c, err := NewContext(ContextConfig{TLS: tls, Logger: zap.New(core)})
	require.NoError(t, err)
	w, err := c.NewWorker(WorkerConfig{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if ep, err := w.Connect(ctx, addr); err == nil {
		// A UCX that connects lazily finds the peer gone on the first send.
		mem, err := c.Allocate(64)
		require.NoError(t, err)
		r := ep.TagSend(mem, 0, 64, 1)
		select {
		case <-ep.Failed():
		case <-ctx.Done():
		}
		_ = ep.ForceClose(ctx)
		<-r.Done()
		require.NoError(t, mem.Close())
	}
	require.NoError(t, w.Close())
	require.NoError(t, c.Close())
	for _, e := range seen.FilterLoggerName("ucx").All() {
		fmt.Printf("ROUTED %s %s %s %s\n", e.Level, e.ContextMap()["ucx_level"], e.ContextMap()["at"], e.Message)
	}
}

// deadWorkerAddress is the address of a worker that is gone: over shared memory one that a
// child process printed before it exited, over TCP one this process closed.
func deadWorkerAddress(t *testing.T, tls string) []byte {
	if strings.Contains(tls, "tcp") {
		c, err := NewContext(ContextConfig{TLS: tls})
		require.NoError(t, err)
		w, err := c.NewWorker(WorkerConfig{})
		require.NoError(t, err)
		addr := w.Address()
		require.NoError(t, w.Close())
		require.NoError(t, c.Close())
		return addr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestAddressPrintChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), addrPrintEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, line := range strings.Split(string(out), "\n") {
		var pid int
		var hexAddr string
		if _, err := fmt.Sscanf(line, "CHILD: %d %s", &pid, &hexAddr); err == nil {
			addr, err := hex.DecodeString(hexAddr)
			require.NoError(t, err)
			return addr
		}
	}
	t.Fatalf("the child printed no address: %s", out)
	return nil
}

// When a peer is gone, what UCX logs about it (a refused TCP connection, a dead process's
// shared memory) reaches the logger, and a line from the sources that report a gone peer is
// debug: the engine reports the failure itself, naming the peer. Nothing UCX logs is printed
// raw on the process's stderr. UCX 1.13 reports the dead process's shared memory from
// mm_posix.c; 1.22 finds no transport to it at all (select.c, "no active messages
// transport", a warning: the same line says a transport list that cannot reach a live peer).
func TestUCXLog_DeadPeerLinesReachTheLoggerNotStderr(t *testing.T) {
	for _, tr := range []struct {
		name, tls string
		file      map[string]string // by UCX version: the source that logs the failure
	}{
		{"tcp", "tcp,self", map[string]string{"1.13": "sock.c", "1.22": "sock.c"}},
		{"shm", "posix,cma,self", map[string]string{"1.13": "mm_posix.c", "1.22": "select.c"}},
	} {
		t.Run(tr.name, func(t *testing.T) {
			addr := deadWorkerAddress(t, tr.tls)
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestUCXLogChild$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), ucxLogChildEnv+"="+tr.tls, ucxLogDeadEnv+"="+hex.EncodeToString(addr))
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			require.NoError(t, cmd.Run(), "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
			require.NotRegexp(t, regexp.MustCompile(`UCX\s+(ERROR|WARN)`), stderr.String(), "UCX printed on stderr")
			var routed []string
			for _, line := range strings.Split(stdout.String(), "\n") {
				if strings.HasPrefix(line, "ROUTED ") {
					routed = append(routed, line)
				}
			}
			require.NotEmpty(t, routed, "UCX's lines about the dead peer reached the logger:\n%s", stdout.String())
			if file, ok := tr.file[UCXVersion()[:strings.LastIndex(UCXVersion(), ".")]]; ok {
				require.True(t, slices.ContainsFunc(routed, func(l string) bool { return strings.Contains(l, " "+file+":") }),
					"UCX %s logs the dead peer from %s:\n%s", UCXVersion(), file, stdout.String())
			}
			for _, line := range routed {
				for _, g := range ucxPeerGoneLines {
					if strings.Contains(line, " "+g.file+":") && strings.Contains(line, g.text) {
						require.True(t, strings.HasPrefix(line, "ROUTED debug ERROR "), "a dead peer's line is debug, not an error: %s", line)
					}
				}
			}
		})
	}
}
