// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/kvxfer/kvxfer/internal/hopstamp"
)

// The hop stamps of run --hops (RunConfig.Hops): both ends record when each request passes
// the engine's steps and its UCX workers' wakes (internal/hopstamp); every prefill rank writes
// its stamps to a file when the decode end says bye, and the decode end joins them with its
// own by request id and wall clock and prints, for each row, the median and 90th percentile of
// each hop's time from the hop before it.

// hopRow is one timed row's requests, by id.
type hopRow struct {
	name string
	ids  map[uint64]bool
}

// hopsFile is where prefill rank rank writes its stamps.
func hopsFile(dir string, rank int) string {
	return filepath.Join(dir, fmt.Sprintf("prefill%d.json", rank))
}

// writeHops (a prefill rank, at bye) stops its stamps and writes them.
func writeHops(dir string, rank int) error {
	b, err := json.Marshal(hopstamp.Stop())
	if err != nil {
		return err
	}
	return os.WriteFile(hopsFile(dir, rank), b, 0o600)
}

// printHops (the decode end, once every prefill rank has exited) prints each row's hops: its
// own stamps and those of the prefill ranks that wrote theirs.
func printHops(w io.Writer, cfg RunConfig, rows []hopRow) {
	stamps := hopstamp.Stop()
	for i := range stamps {
		stamps[i].Hop = "decode: " + stamps[i].Hop
	}
	for rank := range cfg.PrefillTP {
		b, err := os.ReadFile(hopsFile(cfg.HopsDir, rank))
		var theirs []hopstamp.Stamp
		if err == nil {
			err = json.Unmarshal(b, &theirs)
		}
		if err != nil {
			fmt.Fprintf(w, "kvxbench: note: prefill rank %d's hop stamps: %v\n", rank, err)
			continue
		}
		for i := range theirs {
			theirs[i].Hop = fmt.Sprintf("prefill%d: %s", rank, theirs[i].Hop)
		}
		stamps = append(stamps, theirs...)
	}
	if cfg.HopsRaw != "" {
		if err := writeRawHops(cfg.HopsRaw, rows, stamps); err != nil {
			fmt.Fprintf(w, "kvxbench: note: --hops-raw: %v\n", err)
		}
	}
	for _, r := range rows {
		hops := hopstamp.Summarize(stamps, r.ids)
		fmt.Fprintf(w, "hops: %s (%d requests; us from the hop above, at p50 and p90; at: from the first stamp, median request)\n", r.name, len(r.ids))
		for _, h := range hops {
			fmt.Fprintf(w, "  %-52s %6d %9.1f %9.1f %9.1f\n", h.Name, h.Requests, h.P50us, h.P90us, h.AtP50us)
		}
	}
}

// rawHops is what --hops-raw writes: each timed row's request ids, and every stamp of both
// ends (a stamp's hop prefixed by its end, as printHops names them), in wall-clock order.
type rawHops struct {
	Rows   []rawHopRow      `json:"rows"`
	Stamps []hopstamp.Stamp `json:"stamps"`
}

type rawHopRow struct {
	Name string   `json:"name"`
	IDs  []uint64 `json:"ids"`
}

// writeRawHops writes rows and stamps to path (--hops-raw).
func writeRawHops(path string, rows []hopRow, stamps []hopstamp.Stamp) error {
	raw := rawHops{Stamps: slices.Clone(stamps)}
	slices.SortStableFunc(raw.Stamps, func(a, b hopstamp.Stamp) int { return cmp.Compare(a.Unix, b.Unix) })
	for _, r := range rows {
		ids := slices.Sorted(maps.Keys(r.ids))
		raw.Rows = append(raw.Rows, rawHopRow{Name: r.name, IDs: ids})
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
