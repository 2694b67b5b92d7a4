// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"syscall"
	"time"
)

// MemcpyConfig is `kvxbench memcpy`: the host's copy rate with 1..Threads threads, over
// memory as the KV pools lie (two MAP_SHARED mappings of Bytes, copied in Piece-sized pieces
// in a random order, as a request's scattered blocks are), so a lanes figure can be read
// against what the host gave two copiers in the same minute.
type MemcpyConfig struct {
	Bytes, Piece int64
	Threads      int
	Rounds       int
}

// MemcpyResult is one measured copy: the threads and GB/s.
type MemcpyResult struct {
	Threads int
	GBps    float64
}

// Memcpy measures cfg and writes one line per (round, threads): "threads=N gbps=X".
func Memcpy(ctx context.Context, cfg MemcpyConfig, w io.Writer) ([]MemcpyResult, error) {
	if cfg.Bytes <= 0 || cfg.Piece <= 0 || cfg.Bytes%cfg.Piece != 0 || cfg.Threads < 1 || cfg.Rounds < 1 {
		return nil, fmt.Errorf("memcpy: %d bytes in %d-byte pieces, %d threads, %d rounds: want a positive whole number of pieces, threads and rounds", cfg.Bytes, cfg.Piece, cfg.Threads, cfg.Rounds)
	}
	mapShared := func() ([]byte, error) {
		return syscall.Mmap(-1, 0, int(cfg.Bytes), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_ANONYMOUS)
	}
	src, err := mapShared()
	if err != nil {
		return nil, fmt.Errorf("memcpy: mapping %d bytes: %w", cfg.Bytes, err)
	}
	defer func() { _ = syscall.Munmap(src) }()
	dst, err := mapShared()
	if err != nil {
		return nil, fmt.Errorf("memcpy: mapping %d bytes: %w", cfg.Bytes, err)
	}
	defer func() { _ = syscall.Munmap(dst) }()
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // every page touched before the clock runs
	n := int(cfg.Bytes / cfg.Piece)
	from, to := rand.Perm(n), rand.Perm(n)
	var out []MemcpyResult
	for round := 0; round < cfg.Rounds; round++ {
		for th := 1; th <= cfg.Threads; th++ {
			if err := ctx.Err(); err != nil {
				return out, err
			}
			next := make(chan int, n)
			for i := range n {
				next <- i
			}
			close(next)
			start := time.Now()
			var wg sync.WaitGroup
			for range th {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range next {
						s, d := int64(from[i])*cfg.Piece, int64(to[i])*cfg.Piece
						copy(dst[d:d+cfg.Piece], src[s:s+cfg.Piece])
					}
				}()
			}
			wg.Wait()
			r := MemcpyResult{Threads: th, GBps: float64(cfg.Bytes) / time.Since(start).Seconds() / 1e9}
			out = append(out, r)
			fmt.Fprintf(w, "threads=%d gbps=%.3f\n", r.Threads, r.GBps)
		}
	}
	return out, nil
}
