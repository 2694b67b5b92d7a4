// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer/internal/bench"
)

// flagSet is a subcommand's flags with its synopsis, for -h.
type flagSet struct {
	*flag.FlagSet
	synopsis string
	out      *bench.Outputs
}

// newFlagSet makes a subcommand's flag set. Parse errors are reported once, by report, as a
// usage error; -h prints the flags to stderr.
func newFlagSet(name, synopsis string, out *bench.Outputs) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {} // the flag package calls it on every parse error; we print once
	return &flagSet{FlagSet: fs, synopsis: synopsis, out: out}
}

// parseFlags parses args and turns the flag package's errors into usage errors.
func parseFlags(fs *flagSet, args []string) error {
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintf(fs.out.Stderr, "Usage: kvxbench %s\n\nFlags:\n", fs.synopsis)
		fs.SetOutput(fs.out.Stderr)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
		return errHelpShown
	case err != nil:
		return usagef("%s: %v (see `kvxbench help %s`)", fs.Name(), err, fs.Name())
	}
	return nil
}

// parseTokens reads a comma-separated list of token counts; k and m suffixes are 1024 and
// 1024*1024 (prompts are quoted as 1k, 4k, 16k).
func parseTokens(flagName, s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		n, err := parseCount(f)
		if err != nil || n <= 0 {
			return nil, usagef("--%s: %q is not a positive token count (write 1024, 1k or 16k)", flagName, f)
		}
		out = append(out, n)
	}
	return out, nil
}

func parseCount(s string) (int64, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "k"), strings.HasSuffix(s, "K"):
		mult, s = 1<<10, s[:len(s)-1]
	case strings.HasSuffix(s, "m"), strings.HasSuffix(s, "M"):
		mult, s = 1<<20, s[:len(s)-1]
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, err
	}
	if n > (1<<62)/mult {
		return 0, fmt.Errorf("%s overflows", s)
	}
	return n * mult, nil
}

// parseInts reads a comma-separated list of positive integers.
func parseInts(flagName, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, usagef("--%s: %q is not a positive integer", flagName, strings.TrimSpace(f))
		}
		out = append(out, n)
	}
	return out, nil
}

// parseBytes reads a size such as 4194304, 4MiB, 4M or 512KiB (binary units).
func parseBytes(flagName, s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSuffix(t, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, usagef("--%s: %q is not a size (write 4194304, 4MiB or 512KiB)", flagName, s)
	}
	return n * mult, nil
}

// checkDuration refuses durations that cannot measure anything.
func checkDuration(flagName string, d time.Duration) error {
	if d <= 0 {
		return usagef("--%s = %v: must be positive (how long each scenario is measured, such as 2s)", flagName, d)
	}
	return nil
}

// outputFlags are the flags every measuring subcommand shares.
type outputFlags struct{ bench.Output }

func (f *outputFlags) register(fs *flagSet, defaultDuration time.Duration, baselineHelp string) {
	fs.BoolVar(&f.JSON, "json", false, "print one JSON object per result instead of the table")
	fs.StringVar(&f.Plot, "plot", "", "also draw bandwidth against message size, with the baseline beside it, into this .svg file")
	fs.BoolVar(&f.Baseline, "baseline", true, baselineHelp)
	fs.BoolVar(&f.NoVerify, "no-verify", false, "skip the checksum of every moved byte")
	fs.DurationVar(&f.Duration, "duration", defaultDuration, "how long each scenario is measured")
	fs.IntVar(&f.MaxIters, "max-iters", 10000, "most requests timed per scenario, whatever the duration")
}

func (f *outputFlags) check() error {
	if err := checkDuration("duration", f.Duration); err != nil {
		return err
	}
	if f.MaxIters <= 0 {
		return usagef("--max-iters = %d: must be positive", f.MaxIters)
	}
	return checkPlotPath(f.Plot)
}

// checkPlotPath refuses a --plot file kvxbench cannot draw, before anything is measured.
func checkPlotPath(path string) error {
	if path == "" {
		return nil
	}
	if !strings.EqualFold(filepath.Ext(path), ".svg") {
		return usagef("--plot %q: only .svg is drawn (open it in a browser, or convert it with rsvg-convert)", path)
	}
	return nil
}
