// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/kvxfer/kvxfer/internal/bench/plot"
)

// Outputs carries the writers a benchmark prints to: results on Stdout, everything else
// (progress, warnings, notes) on Stderr, so JSON output can be piped as is.
type Outputs struct {
	Stdout io.Writer
	Stderr io.Writer
}

// Output is what every measuring subcommand shares: how results are printed and how long
// each scenario is measured.
type Output struct {
	// JSON prints one JSON object per result instead of the table.
	JSON bool
	// Plot, when set, is the .svg file the results are drawn into.
	Plot string
	// Baseline measures the limit beside each operation (memcpy, ucx_perftest).
	Baseline bool
	// NoVerify skips the checksum of every moved byte.
	NoVerify bool
	// Duration is how long each scenario is measured.
	Duration time.Duration
	// MaxIters is the most requests timed per scenario, whatever Duration.
	MaxIters int
}

// UsageError is input a benchmark refuses before it starts: the message says what to fix,
// in the terms of kvxbench's flags.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

// Usagef makes a UsageError.
func Usagef(format string, a ...any) error { return &UsageError{Msg: fmt.Sprintf(format, a...)} }

// humanBytes prints a byte count in binary units, as the table shows it.
func humanBytes(n int64) string { return plot.HumanBytes(n) }

// humanTokens prints a token count as the flags take it: 4096 is 4k.
func humanTokens(n int64) string {
	if n >= 1<<10 && n%(1<<10) == 0 {
		return fmt.Sprintf("%dk", n>>10)
	}
	return strconv.FormatInt(n, 10)
}
