// SPDX-License-Identifier: Apache-2.0

package proc_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/internal/peerproc/proc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// gone says whether pid has exited and been reaped (or, reparented, is a zombie its new parent
// has not reaped yet): either way it runs no more.
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(f) > 0 && f[0] == "Z"
}

// Every stdout line reaches Lines in order before Exited closes; stderr is kept in the tail;
// the exit status is the child's.
func TestStart_LinesInOrderThenReaped(t *testing.T) {
	var lines []string
	c, err := proc.Start(context.Background(), exec.Command("/bin/sh", "-c", "echo one; echo two; echo oops >&2; exit 3"),
		proc.Options{Lines: func(l string) { lines = append(lines, l) }})
	require.NoError(t, err)
	require.True(t, c.Reap(10*time.Second))
	require.Equal(t, []string{"one", "two"}, lines)
	var ee *exec.ExitError
	require.ErrorAs(t, c.Err(), &ee)
	require.Equal(t, 3, ee.ExitCode())
	require.Equal(t, "oops", c.LastLines(1))
	require.False(t, c.Cmd.ProcessState == nil)
}

// Send and CloseStdin talk to a child that reads its stdin.
func TestStart_SendAndCloseStdin(t *testing.T) {
	got := make(chan string, 4)
	c, err := proc.Start(context.Background(), exec.Command("cat"), proc.Options{Stdin: true, Lines: func(l string) { got <- l }})
	require.NoError(t, err)
	require.NoError(t, c.Send("PEER 00ff"))
	select {
	case l := <-got:
		require.Equal(t, "PEER 00ff", l)
	case <-time.After(10 * time.Second):
		t.Fatal("cat did not echo the line")
	}
	require.NoError(t, c.CloseStdin())
	require.True(t, c.Reap(10*time.Second), "cat ends at the end of its input")
	require.NoError(t, c.Err())
}

// Stop kills a child that does not exit within its grace, with the grandchildren of its
// group, and reaps it.
func TestStop_KillsTheGroupAndReaps(t *testing.T) {
	grandchild := make(chan int, 1)
	c, err := proc.Start(context.Background(), exec.Command("/bin/sh", "-c", `trap "" INT TERM; sleep 60 & echo $!; wait`),
		proc.Options{Group: true, Lines: func(l string) {
			if pid, err := strconv.Atoi(l); err == nil {
				grandchild <- pid
			}
		}})
	require.NoError(t, err)
	var gc int
	select {
	case gc = <-grandchild:
	case <-time.After(10 * time.Second):
		t.Fatal("no grandchild pid")
	}
	err = c.Stop(10*time.Millisecond, 10*time.Second)
	require.ErrorIs(t, err, proc.ErrKilled)
	require.True(t, gone(c.Pid()), "the child is reaped")
	deadline := time.Now().Add(10 * time.Second)
	for !gone(gc) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	require.True(t, gone(gc), "the grandchild %d went with its group", gc)
	require.Error(t, c.Signal(syscall.SIGTERM), "a reaped child is not signalled")
}

// A child that exits by itself within its grace is stopped without a kill.
func TestStop_ChildThatExitsIsNotKilled(t *testing.T) {
	c, err := proc.Start(context.Background(), exec.Command("true"), proc.Options{})
	require.NoError(t, err)
	require.NoError(t, c.Stop(10*time.Second, time.Second))
	require.NoError(t, c.Err())
}

// The end of the context kills the child.
func TestStart_ContextEndKills(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	c, err := proc.Start(ctx, exec.Command("sleep", "60"), proc.Options{Group: true})
	require.NoError(t, err)
	cancel()
	require.True(t, c.Reap(10*time.Second))
	var ee *exec.ExitError
	require.ErrorAs(t, c.Err(), &ee)
	require.Equal(t, syscall.SIGKILL, ee.Sys().(syscall.WaitStatus).Signal())
}

func TestLastLines(t *testing.T) {
	require.Equal(t, "b | c", proc.LastLines("a\n\n b \nc\n", 2))
	require.Equal(t, "(no output)", proc.LastLines(" \n", 3))
	tail := proc.NewTail(4)
	_, _ = tail.Write([]byte("abcdef"))
	require.Equal(t, "cdef", tail.String())
}
