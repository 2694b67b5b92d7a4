// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/hopstamp"
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
// is stamped or printed. With --hops-raw every stamp of both processes and each row's request
// ids go to a file as well: each row's ids are its requests, and each has stamps of both ends.
func TestRunLoopback_Hops(t *testing.T) {
	skipWithoutHostCopy(t)
	for _, hops := range []bool{true, false} {
		t.Run(map[bool]string{true: "with --hops", false: "without"}[hops], func(t *testing.T) {
			cfg := runFor(t, runSpec{layers: 4, prompts: []int64{64}, concurrency: []int{1}, slotBytes: 256 << 10,
				memCap: 512 << 20, tls: "posix,cma,self", sender: SenderExpose})
			cfg.Hops = hops
			raw := filepath.Join(t.TempDir(), "hops.json")
			if hops {
				cfg.HopsRaw = raw
			}
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
			b, err := os.ReadFile(raw)
			require.NoError(t, err)
			var got rawHops
			require.NoError(t, json.Unmarshal(b, &got))
			require.Len(t, got.Rows, len(names))
			ends := map[uint64]map[string]bool{}
			for _, s := range got.Stamps {
				if ends[s.ID] == nil {
					ends[s.ID] = map[string]bool{}
				}
				ends[s.ID][strings.SplitN(s.Hop, ":", 2)[0]] = true
			}
			for i, r := range got.Rows {
				require.Equal(t, names[i], r.Name)
				require.NotEmpty(t, r.IDs, "row %s", r.Name)
				for _, id := range r.IDs {
					require.True(t, ends[id]["decode"] && ends[id]["prefill0"], "request %d of %s: stamps of both ends", id, r.Name)
				}
			}
			require.True(t, slices.IsSortedFunc(got.Stamps, func(a, b hopstamp.Stamp) int { return cmp.Compare(a.Unix, b.Unix) }))
		})
	}
}
