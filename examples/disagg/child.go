// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"
)

// decodeProcess is the decode role re-executed from this binary as a second process. It is
// always reaped: wait bounds the wait by the caller's context, and stop interrupts it, then
// kills it, each step bounded, so no exit path of the prefill process leaves it running.
type decodeProcess struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait has returned
	err    error         // cmd.Wait's error, read after exited closes
	// interruptGrace and reapBound are childInterruptGrace and childReapBound (shorter in
	// tests).
	interruptGrace, reapBound time.Duration
}

// Bounds on reaping the decode process (variables so tests can shorten them).
var (
	// childInterruptGrace is how long an interrupted decode process gets to close its
	// engine (the engine's own Close is bounded by 10s here) before it is killed.
	childInterruptGrace = 12 * time.Second
	// childReapBound is how long a killed process may take to be reaped, its output
	// included (exec's WaitDelay is shorter).
	childReapBound = 5 * time.Second
)

// decodeExecutable is the binary the decode process runs: this one (a test substitutes a
// decode process that fails or hangs).
var decodeExecutable = os.Executable

// startDecodeProcess runs this binary again as `-role=decode` against the control plane at
// addr, forwarding its stdout line by line through out and its stderr as is.
func startDecodeProcess(o options, addr string, out *printer, stderr io.Writer) (*decodeProcess, error) {
	exe, err := decodeExecutable()
	if err != nil {
		return nil, fmt.Errorf("finding this binary to start the decode process: %w", err)
	}
	args := []string{"-role=decode", "-transport=ucx", "-control=" + addr, "-tls=" + o.tls,
		"-tokens=" + strconv.Itoa(o.tokens), "-timeout=" + o.timeout.String(),
		"-progress-deadline=" + o.deadline.String(), "-v=" + strconv.FormatBool(o.verbose), "-discovery=" + o.discovery}
	cmd := exec.Command(exe, args...)
	cmd.Stdout = &lineWriter{out: out}
	cmd.Stderr = stderr
	return startProcess(cmd)
}

// startProcess starts cmd and the goroutine that reaps it.
func startProcess(cmd *exec.Cmd) (*decodeProcess, error) {
	cmd.WaitDelay = 2 * time.Second // a grandchild holding the pipes cannot hold up Wait
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the decode process: %w", err)
	}
	p := &decodeProcess{cmd: cmd, exited: make(chan struct{}), interruptGrace: childInterruptGrace, reapBound: childReapBound}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

func (p *decodeProcess) pid() int { return p.cmd.Process.Pid }

// wait waits for the decode process to exit, at most until done closes.
func (p *decodeProcess) wait(done <-chan struct{}) error {
	select {
	case <-p.exited:
		return p.err
	case <-done:
		return errors.New("still running")
	}
}

// stop ends the decode process if it is still running (an interrupt, then a kill) and reaps
// it. It returns nil if the process had already exited, whatever its status (wait reported
// that).
func (p *decodeProcess) stop() error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.exited:
		return fmt.Errorf("decode process (pid %d) interrupted: %v", p.pid(), p.err)
	case <-time.After(p.interruptGrace):
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.exited:
		return fmt.Errorf("decode process (pid %d) killed after ignoring an interrupt for %v", p.pid(), p.interruptGrace)
	case <-time.After(p.reapBound):
		return fmt.Errorf("decode process (pid %d) killed but not reaped within %v", p.pid(), p.reapBound)
	}
}

// lineWriter hands whole lines to a printer, so the decode process's lines never interleave
// with the prefill process's mid-line.
type lineWriter struct {
	mu   sync.Mutex
	out  *printer
	part []byte
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.part = append(w.part, b...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 {
			return len(b), nil
		}
		w.out.printf("%s", w.part[:i])
		w.part = w.part[i+1:]
	}
}
