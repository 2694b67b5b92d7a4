// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progressMinRun is the shortest expected run that gets a progress bar: below it the bar
// would flash and vanish.
const progressMinRun = 3 * time.Second

// progress draws a one-line bar on a terminal: how much of the run's expected time has
// passed, and the scenario being measured. It is a no-op when its writer is not a terminal,
// so pipes and logs see results only.
type progress struct {
	mu      sync.Mutex
	w       io.Writer // nil: disabled
	total   time.Duration
	start   time.Time
	label   string
	lastLen int
	now     func() time.Time
}

// newProgress returns a bar on w when w is a terminal and the run is expected to take at
// least progressMinRun; otherwise a disabled bar.
func newProgress(w io.Writer, expected time.Duration) *progress {
	if !isTerminal(w) || expected < progressMinRun {
		return &progress{}
	}
	return &progress{w: w, total: expected, start: time.Now(), now: time.Now}
}

// isTerminal reports whether w is a character device (a terminal), without a dependency:
// pipes, files and buffers are not.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// step names the scenario now running and redraws the bar.
func (p *progress) step(label string) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.label = label
	p.drawLocked()
}

// tick redraws the bar; measurement loops call it between iterations.
func (p *progress) tick() {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drawLocked()
}

func (p *progress) drawLocked() {
	const width = 30
	frac := float64(p.now().Sub(p.start)) / float64(p.total)
	frac = min(max(frac, 0), 1)
	filled := int(frac * width)
	line := fmt.Sprintf("\r[%s%s] %3.0f%% %s", strings.Repeat("#", filled), strings.Repeat(".", width-filled), frac*100, p.label)
	pad := max(p.lastLen-len(line), 0)
	fmt.Fprint(p.w, line+strings.Repeat(" ", pad))
	p.lastLen = len(line)
}

// done erases the bar so the table that follows starts on a clean line.
func (p *progress) done() {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprint(p.w, "\r"+strings.Repeat(" ", p.lastLen)+"\r")
	p.lastLen = 0
}
