// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// lockedBuffer is a bytes.Buffer the progress bar and the run may write at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// run --hops prints, for every timed row, the hops of both processes: the decode end's own
// (the bench's clock, the engine's steps, its worker's wakes) and the prefill peer's, which
// only reach the decode end through the file the peer writes at bye. Without --hops nothing
// is stamped or printed.
func TestRunLoopback_Hops(t *testing.T) {
	skipWithoutHostCopy(t)
	for _, hops := range []bool{true, false} {
		t.Run(map[bool]string{true: "with --hops", false: "without"}[hops], func(t *testing.T) {
			cfg := runFor(t, runSpec{layers: 4, prompts: []int64{64}, concurrency: []int{1}, slotBytes: 256 << 10,
				memCap: 512 << 20, tls: "posix,cma,self", sender: SenderExpose})
			cfg.Hops = hops
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var stderr lockedBuffer
			var names []string
			err := Loopback(ctx, cfg, Output{Duration: 20 * time.Millisecond, MaxIters: 20}, "",
				&Outputs{Stdout: discard{}, Stderr: &stderr}, func(r Result) error { names = append(names, r.Name); return nil })
			if !engineBuilt {
				require.ErrorIs(t, err, errEngineMissing)
				return
			}
			require.NoError(t, err)
			require.NotEmpty(t, names)
			out := stderr.String()
			if !hops {
				require.NotContains(t, out, "hops:")
				return
			}
			for _, n := range names {
				i := strings.Index(out, "hops: "+n+" (")
				require.GreaterOrEqual(t, i, 0, "no hops for %s in:\n%s", n, out)
				table := out[i:]
				if j := strings.Index(table[1:], "hops: "); j >= 0 {
					table = table[:j+1]
				}
				for _, hop := range []string{"decode: bench Receive called", "decode: recv Engine.start", "decode: recv finished",
					"decode: bench waiter awake", "decode: submit queued", "prefill0: send Engine.start", "prefill0: *wire.Done in",
					"prefill0: send finished", "total"} {
					require.Contains(t, table, "  "+hop+" ", "row %s", n)
				}
			}
		})
	}
}
