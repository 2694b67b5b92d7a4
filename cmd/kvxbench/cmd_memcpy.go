// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"

	"github.com/kvxfer/kvxfer/internal/bench"
)

// cmdMemcpy is `kvxbench memcpy`: what the host gives one and several copiers, over memory laid
// out as the pools are, for reading a lanes figure against (make bench-paths prints both).
func cmdMemcpy(ctx context.Context, args []string, out *outputs) error {
	fs := newFlagSet("memcpy", "memcpy [flags]", out)
	size := fs.String("size", "512MiB", "bytes copied per measurement, between two shared mappings")
	piece := fs.String("piece", "2MiB", "bytes per copy call, in a random order (a request's scattered blocks)")
	threads := fs.Int("threads", 2, "measure with 1 up to this many threads copying at once")
	rounds := fs.Int("rounds", 3, "measurements per thread count, alternating")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("memcpy takes no arguments, got %q", fs.Args())
	}
	b, err := parseBytes("size", *size)
	if err != nil {
		return err
	}
	p, err := parseBytes("piece", *piece)
	if err != nil {
		return err
	}
	if *threads < 1 || *threads > 64 || *rounds < 1 || p <= 0 || b%p != 0 {
		return usagef("memcpy: --size must be a whole number of --piece, --threads in [1, 64], --rounds positive")
	}
	_, err = bench.Memcpy(ctx, bench.MemcpyConfig{Bytes: b, Piece: p, Threads: *threads, Rounds: *rounds}, out.Stdout)
	return err
}
