// SPDX-License-Identifier: Apache-2.0

package bench

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

// progress draws a one-line bar on a terminal: how many of the run's steps (scenarios) are
// done, plus the expected share of the current one, and its name. Steps are counted rather
// than time because a slow transfer can take many times its --duration (a round is never cut
// short). It is a no-op when its writer is not a terminal, so pipes and logs see results only.
type progress struct {
	mu        sync.Mutex
	w         io.Writer // nil: disabled
	steps     int
	perStep   time.Duration
	stepIdx   int // steps begun; the current one is stepIdx-1
	stepStart time.Time
	label     string
	lastLen   int
	lastDraw  time.Time
	now       func() time.Time
	stop      chan struct{} // closed by done: ends the redraw ticker
	stopOnce  sync.Once
}

// redrawEvery limits redraws from tick: a terminal needs no more than ten a second.
const redrawEvery = 100 * time.Millisecond

// newProgress returns a bar on w for steps steps of about perStep each, when w is a terminal
// and the run is expected to take at least progressMinRun; otherwise a disabled bar.
func newProgress(w io.Writer, steps int, perStep time.Duration) *progress {
	if !isTerminal(w) || time.Duration(steps)*perStep < progressMinRun {
		return &progress{}
	}
	p := &progress{w: w, steps: steps, perStep: perStep, now: time.Now, stop: make(chan struct{})}
	// A transfer round can take seconds without a tick: redraw on a timer too, until done.
	go func() {
		t := time.NewTicker(4 * redrawEvery)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				p.tick()
			case <-p.stop:
				return
			}
		}
	}()
	return p
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

// step begins the next step, named label, and redraws the bar.
func (p *progress) step(label string) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stepIdx++
	p.stepStart = p.now()
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
	if p.now().Sub(p.lastDraw) >= redrawEvery {
		p.drawLocked()
	}
}

func (p *progress) drawLocked() {
	p.lastDraw = p.now()
	const width = 30
	done := float64(max(p.stepIdx-1, 0))
	if p.stepIdx > 0 && p.perStep > 0 {
		done += min(float64(p.now().Sub(p.stepStart))/float64(p.perStep), 0.99)
	}
	frac := min(max(done/float64(max(p.steps, 1)), 0), 1)
	filled := int(frac * width)
	line := fmt.Sprintf("\r[%s%s] %d/%d %s", strings.Repeat("#", filled), strings.Repeat(".", width-filled),
		max(p.stepIdx, 1), p.steps, p.label)
	pad := max(p.lastLen-len(line), 0)
	fmt.Fprint(p.w, line+strings.Repeat(" ", pad))
	p.lastLen = len(line)
}

// done erases the bar so the table that follows starts on a clean line.
func (p *progress) done() {
	if p.w == nil {
		return
	}
	p.stopOnce.Do(func() {
		if p.stop != nil {
			close(p.stop)
		}
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lastLen > 0 {
		fmt.Fprint(p.w, "\r"+strings.Repeat(" ", p.lastLen)+"\r")
	}
	p.lastLen = 0
}
