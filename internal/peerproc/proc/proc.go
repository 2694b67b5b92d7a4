// SPDX-License-Identifier: Apache-2.0

// Package proc starts a child process and ends it, every wait bounded: its stdout read line by
// line (or copied to a writer), its stderr kept (the last bytes, for error messages), its exit
// awaited by one goroutine, and Stop or Kill that end it (its whole process group, when it has
// one) and reap it within a bound, so no child outlives its parent's run as a zombie. It is
// the core of package peerproc without the testing package, so that binaries use it too:
// kvxbench's peer processes and its ucx_perftest baseline, the stress soak's peer processes,
// and peerproc's test harness for the UCX peers.
package proc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Errors of Stop.
var (
	// ErrKilled: the child did not exit within the grace Stop gave it, and was killed.
	ErrKilled = errors.New("child killed")
	// ErrNotReaped: the child was killed but not reaped within the bound Stop gave it.
	ErrNotReaped = errors.New("child killed but not reaped")
)

// Options say how Start wires a child. The zero value starts it with stdin, stdout and stderr
// on /dev/null except stderr, which is kept in Child.Tail.
type Options struct {
	// Lines, when set, is called with each line the child prints on stdout, in order, from
	// one goroutine of its own; the child is reaped after its last line, so every line has
	// been handled once Exited is closed. Lines must not block for long: the child blocks
	// when its stdout pipe is full.
	Lines func(line string)
	// Stdout receives the child's stdout when Lines is nil (nil: discarded).
	Stdout io.Writer
	// Stderr receives the child's stderr; nil keeps its last TailBytes in Child.Tail.
	Stderr io.Writer
	// Stdin opens a pipe to the child's stdin, for Send and CloseStdin.
	Stdin bool
	// Group starts the child in a process group of its own; Kill and Signal then reach the
	// whole group, so nothing the child started survives it.
	Group bool
	// DieWithParent has the kernel kill the child when this process dies first (Linux; a
	// no-op elsewhere): the exit path no deferred Stop covers.
	DieWithParent bool
	// WaitDelay bounds how long reaping waits for the output pipes after the child exited
	// (a grandchild holding them open); 0 is 2 seconds.
	WaitDelay time.Duration
}

// TailBytes is how much of a child's stderr Child.Tail keeps when Options.Stderr is nil.
const TailBytes = 4 << 10

// Child is a started child process.
type Child struct {
	// Cmd is the command; read its ProcessState after Exited is closed.
	Cmd    *exec.Cmd
	tail   *Tail
	group  bool
	wmu    sync.Mutex
	stdin  io.WriteCloser
	exited chan struct{}
	err    error // cmd.Wait's, set before exited closes
}

// Start starts cmd as o says and the goroutine that reaps it. When ctx ends before the child
// exits, the child is killed (as Kill).
func Start(ctx context.Context, cmd *exec.Cmd, o Options) (*Child, error) {
	c := &Child{Cmd: cmd, group: o.Group, exited: make(chan struct{})}
	if o.Group || o.DieWithParent {
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.Setpgid = o.Group
		if o.DieWithParent {
			dieWithParent(cmd.SysProcAttr)
		}
	}
	cmd.WaitDelay = o.WaitDelay
	if cmd.WaitDelay == 0 {
		cmd.WaitDelay = 2 * time.Second
	}
	if o.Stderr != nil {
		cmd.Stderr = o.Stderr
	} else {
		c.tail = NewTail(TailBytes)
		cmd.Stderr = c.tail
	}
	var stdout io.ReadCloser
	var err error
	if o.Lines != nil {
		if stdout, err = cmd.StdoutPipe(); err != nil {
			return nil, err
		}
	} else {
		cmd.Stdout = o.Stdout
	}
	if o.Stdin {
		if c.stdin, err = cmd.StdinPipe(); err != nil {
			return nil, err
		}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		if stdout == nil {
			return
		}
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			o.Lines(sc.Text())
		}
		_, _ = io.Copy(io.Discard, stdout) // past an overlong line: keep the child unblocked
	}()
	go func() {
		<-readerDone // Wait must follow the last read of stdout
		c.err = cmd.Wait()
		close(c.exited)
	}()
	if ctx.Done() != nil {
		go func() {
			select {
			case <-ctx.Done():
				c.Kill()
			case <-c.exited:
			}
		}()
	}
	return c, nil
}

// Pid is the child's process id.
func (c *Child) Pid() int { return c.Cmd.Process.Pid }

// Exited is closed once the child has exited and been reaped (and, with Options.Lines, its
// every line handled).
func (c *Child) Exited() <-chan struct{} { return c.exited }

// Err is the child's exit as exec reports it (nil for status 0); valid once Exited is closed.
func (c *Child) Err() error {
	select {
	case <-c.exited:
		return c.err
	default:
		return errors.New("still running")
	}
}

// Tail is the end of the child's stderr when Options.Stderr was nil ("" otherwise).
func (c *Child) Tail() string {
	if c.tail == nil {
		return ""
	}
	return c.tail.String()
}

// LastLines is the last n non-empty lines of the child's stderr, joined with " | ", for error
// messages; "(no output)" when there are none.
func (c *Child) LastLines(n int) string { return LastLines(c.Tail(), n) }

// Send writes line and a newline to the child's stdin (Options.Stdin); safe for concurrent use.
func (c *Child) Send(line string) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.stdin == nil {
		return errors.New("proc: Send without Options.Stdin")
	}
	_, err := io.WriteString(c.stdin, line+"\n")
	return err
}

// CloseStdin closes the child's stdin: end of input for a child that reads it.
func (c *Child) CloseStdin() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.stdin == nil {
		return nil
	}
	return c.stdin.Close()
}

// Signal sends sig to the child (to its group, with Options.Group). A child already reaped is
// not signalled.
func (c *Child) Signal(sig syscall.Signal) error {
	select {
	case <-c.exited:
		return os.ErrProcessDone
	default:
	}
	if c.group {
		return syscall.Kill(-c.Cmd.Process.Pid, sig)
	}
	return c.Cmd.Process.Signal(sig)
}

// Kill kills the child (its group, with Options.Group) with SIGKILL, after a SIGCONT so that a
// stopped child's group is not left stopped. It does not wait: see Reap and Stop.
func (c *Child) Kill() {
	_ = c.Signal(syscall.SIGCONT)
	_ = c.Signal(syscall.SIGKILL)
}

// Reap waits up to d for the child to exit and be reaped, and says whether it was.
func (c *Child) Reap(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.exited:
		return true
	case <-t.C:
		return false
	}
}

// Stop ends the child bounded: it waits up to grace for the child to exit by itself, then
// kills it and waits up to reap for it to be reaped. It returns nil when the child exited
// within grace, ErrKilled when it had to be killed, and ErrNotReaped when even then it was not
// reaped within reap.
func (c *Child) Stop(grace, reap time.Duration) error {
	if c.Reap(grace) {
		return nil
	}
	c.Kill()
	if !c.Reap(reap) {
		return fmt.Errorf("%w: pid %d within %v", ErrNotReaped, c.Pid(), reap)
	}
	return fmt.Errorf("%w: pid %d did not exit within %v", ErrKilled, c.Pid(), grace)
}

// Tail keeps the last bytes written to it, up to its size; safe for concurrent writes (a
// child's stdout and stderr together).
type Tail struct {
	mu  sync.Mutex
	max int
	buf []byte
}

// NewTail makes a Tail of max bytes.
func NewTail(max int) *Tail { return &Tail{max: max} }

func (t *Tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(b), nil
}

func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// LastLines returns the last n non-empty lines of s, trimmed and joined with " | ", for error
// messages; "(no output)" when there are none.
func LastLines(s string, n int) string {
	var keep []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			keep = append(keep, l)
		}
	}
	if len(keep) > n {
		keep = keep[len(keep)-n:]
	}
	if len(keep) == 0 {
		return "(no output)"
	}
	return strings.Join(keep, " | ")
}
