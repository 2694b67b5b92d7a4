// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvxfer/kvxfer/internal/streambench"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/tuning"
)

// StreamOptions are run's --stream settings: layer-wise streaming measured beside simulated
// prefill (internal/streambench), instead of the loopback run.
type StreamOptions struct {
	// LayerCompute is the simulated prefill time per layer (0: the plain transfer time over
	// the layer count, measured first).
	LayerCompute time.Duration
	// Busy spins the CPU through each layer's compute instead of sleeping.
	Busy bool
	// Runs is the plain and streamed transfers per prompt; medians are reported.
	Runs int
	// Transport is streambench.TransportUCX or streambench.TransportMem.
	Transport string
}

// streamResult is one --stream measurement as printed: its name and streambench's figures
// (their JSON names are streambench's).
type streamResult struct {
	Name string `json:"name"`
	streambench.Result
}

// Stream is `kvxbench run --stream`: it measures each prompt with streambench and prints the
// results.
func Stream(ctx context.Context, cfg RunConfig, f StreamOptions, o Output, out *Outputs) error {
	var results []streamResult
	for _, tokens := range cfg.Prompts {
		if err := ctx.Err(); err != nil {
			return err
		}
		dims := cfg.Dims
		r, err := streambench.Run(ctx, streambench.Config{Dims: dims, Tokens: int(tokens), LayerCompute: f.LayerCompute,
			BusyCompute: f.Busy, Runs: f.Runs, Transport: f.Transport, UCXTLS: cfg.TLS,
			Engine: transfer.Config{SlotBytes: cfg.SlotBytes, Tuning: tuning.Config{PipelineDepth: cfg.PipelineDepth}}})
		name := fmt.Sprintf("stream %s %s", cfg.ShapeName, humanTokens(tokens))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		res := streamResult{Name: name, Result: r}
		if o.JSON {
			b, err := json.Marshal(res)
			if err != nil {
				return err
			}
			fmt.Fprintf(out.Stdout, "%s\n", b)
		}
		results = append(results, res)
	}
	if o.JSON {
		return nil
	}
	return writeStreamTable(out.Stdout, results)
}

// writeStreamTable prints --stream results aligned: the plain transfer, the streamed one
// (compute included), the part of it not hidden behind compute, and their ratio.
func writeStreamTable(w io.Writer, results []streamResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join([]string{"scenario", "bytes/req", "plain", "compute/layer", "streamed", "exposed", "exposed ratio", "transport"}, "\t"))
	for _, r := range results {
		fmt.Fprintln(tw, strings.Join([]string{r.Name, humanBytes(r.Bytes), fmtUs(r.PlainUS), fmtUs(r.LayerComputeUS),
			fmtUs(r.StreamUS), fmtUs(r.ExposedUS), fmt.Sprintf("%.2f", r.ExposedRatio), r.Transport + " " + r.Compute}, "\t"))
	}
	return tw.Flush()
}
