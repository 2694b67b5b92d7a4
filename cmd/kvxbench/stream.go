// SPDX-License-Identifier: Apache-2.0

package main

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
)

// streamFlags are run's --stream flags: layer-wise streaming measured beside simulated
// prefill (internal/streambench), instead of the loopback run.
type streamFlags struct {
	on           bool
	layerCompute time.Duration
	busy         bool
	runs         int
	transport    string
}

func (f *streamFlags) register(fs *flagSet) {
	fs.BoolVar(&f.on, "stream", false, "measure layer-wise streaming instead: how much of each prompt's transfer hides behind simulated prefill (exposed time against the plain transfer)")
	fs.DurationVar(&f.layerCompute, "layer-compute", 0, "with --stream: simulated prefill time per layer (default: the plain transfer time over the layer count, measured first)")
	fs.BoolVar(&f.busy, "busy-compute", false, "with --stream: spin the CPU through each layer's compute instead of sleeping (a host that is busy too)")
	fs.IntVar(&f.runs, "stream-runs", 3, "with --stream: plain and streamed transfers per prompt; medians are reported")
	fs.StringVar(&f.transport, "stream-transport", streambench.TransportUCX, "with --stream: ucx (two engines over UCX in this process) or mem (the engine's in-memory transport)")
}

func (f *streamFlags) check() error {
	switch {
	case f.layerCompute < 0:
		return usagef("--layer-compute = %v: must not be negative", f.layerCompute)
	case f.runs < 1:
		return usagef("--stream-runs = %d: must be at least 1", f.runs)
	case f.transport != streambench.TransportUCX && f.transport != streambench.TransportMem:
		return usagef("--stream-transport %q: choose %s or %s", f.transport, streambench.TransportUCX, streambench.TransportMem)
	}
	return nil
}

// streamResult is one --stream measurement as printed: its name and streambench's figures
// (their JSON names are streambench's).
type streamResult struct {
	Name string `json:"name"`
	streambench.Result
}

// runStream measures each prompt with streambench and prints the results.
func runStream(ctx context.Context, cfg runConfig, f streamFlags, o outputFlags, out *outputs) error {
	var results []streamResult
	for _, tokens := range cfg.Prompts {
		if err := ctx.Err(); err != nil {
			return err
		}
		dims := cfg.Dims
		r, err := streambench.Run(ctx, streambench.Config{Dims: dims, Tokens: int(tokens), LayerCompute: f.layerCompute,
			BusyCompute: f.busy, Runs: f.runs, Transport: f.transport, UCXTLS: cfg.TLS,
			Engine: transfer.Config{SlotBytes: cfg.SlotBytes, PipelineDepth: cfg.PipelineDepth}})
		name := fmt.Sprintf("stream %s %s", cfg.ShapeName, humanTokens(tokens))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		res := streamResult{Name: name, Result: r}
		if o.json {
			b, err := json.Marshal(res)
			if err != nil {
				return err
			}
			fmt.Fprintf(out.stdout, "%s\n", b)
		}
		results = append(results, res)
	}
	if o.json {
		return nil
	}
	return writeStreamTable(out.stdout, results)
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
