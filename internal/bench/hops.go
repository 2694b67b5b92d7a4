// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

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
	for _, r := range rows {
		hops := hopstamp.Summarize(stamps, r.ids)
		fmt.Fprintf(w, "hops: %s (%d requests; us from the hop above, at p50 and p90; at: from the first stamp, median request)\n", r.name, len(r.ids))
		for _, h := range hops {
			fmt.Fprintf(w, "  %-52s %6d %9.1f %9.1f %9.1f\n", h.Name, h.Requests, h.P50us, h.P90us, h.AtP50us)
		}
	}
}
