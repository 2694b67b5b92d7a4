// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvxfer/kvxfer/internal/bench/plot"
	"github.com/kvxfer/kvxfer/native"
)

// Result is one measured scenario, as printed in the table and as one JSON object with
// --json. Per-request times are microseconds; GB/s are 10^9 bytes per second.
type Result struct {
	// Name identifies the scenario: operation, model, prompt length and concurrency.
	Name string `json:"name"`
	// Op is what was measured: gather, scatter, transfer.
	Op string `json:"op"`
	// Model is the pool shape's preset name (custom(...) when flags changed it).
	Model string `json:"model"`
	// Tokens is the prompt length of each request.
	Tokens int64 `json:"tokens"`
	// Concurrency is how many requests were in flight at once.
	Concurrency int `json:"concurrency"`
	// Bytes is the KV payload of one request.
	Bytes int64 `json:"bytes"`
	// MessageBytes is the largest message put on the wire or handed to one copy call (one
	// staging chunk); the baseline runs at this size.
	MessageBytes int64 `json:"message_bytes"`
	// TLS is the UCX_TLS of a transfer and its baseline ("" when UCX chose).
	TLS string `json:"tls,omitempty"`
	// PrefillTP is the number of prefill ranks feeding the decode rank (transfers only).
	PrefillTP int `json:"prefill_tp,omitempty"`
	// DecodeTP is the number of decode ranks one prefill rank feeds, where more than one
	// (--decode-tp; transfers only): Bytes and GB/s count every rank's share.
	DecodeTP int `json:"decode_tp,omitempty"`
	// Requests is how many requests were timed.
	Requests int `json:"requests"`
	// GBps is total payload over wall time.
	GBps float64 `json:"gbps"`
	// P50us and P99us are per-request latencies.
	P50us float64 `json:"p50_us"`
	P99us float64 `json:"p99_us"`
	// GatherUs, WireUs and ScatterUs split a request's mean time between its stages, where
	// the operation has them (zero and omitted where it does not).
	GatherUs  float64 `json:"gather_us,omitempty"`
	WireUs    float64 `json:"wire_us,omitempty"`
	ScatterUs float64 `json:"scatter_us,omitempty"`
	// Baseline names the limit measured beside the operation (memcpy, ucx_perftest tag_bw
	// over a transport), empty when none ran.
	Baseline string `json:"baseline,omitempty"`
	// BaselineGBps and Ratio (GBps / BaselineGBps) are present only where a baseline ran.
	BaselineGBps *float64 `json:"baseline_gbps,omitempty"`
	// BaselineBytes is the message size the baseline was measured at (ucx_perftest's -s), or
	// the bytes of one copy for memcpy; the plot draws the baseline there.
	BaselineBytes int64    `json:"baseline_bytes,omitempty"`
	Ratio         *float64 `json:"ratio,omitempty"`
	// Verified is true when every byte moved was checked against the source's checksum.
	Verified bool `json:"verified"`
	// Path is how a transfer moved its bytes, as the engine's handles said: "rma" (the
	// one-copy path's RMA mode: the decode end reads the prefill pool with gets), "direct"
	// (the one-copy path's IOV messages: UCX reads and writes the pools in place) or
	// "staging" (gather, wire, scatter through slots; "staging-pull" when the decode end read
	// each chunk out of the prefill end's slot with a get); several joined with "+" when the
	// requests of a scenario differed.
	Path string `json:"path,omitempty"`
	// Sender is the run's --sender flow where it is not after (first, expose); "rma-one-hop"
	// in Path marks an expose request read at once from its params (a one-hop read).
	Sender string `json:"sender,omitempty"`
	// Layers is how many layers of each block a request moved, where fewer than the pool's
	// (a latency row's one-layer chunk); omitted when every layer.
	Layers int64 `json:"layers,omitempty"`
	// LimitUs is a latency row's same-run limit (Op "latency"): ucx_perftest's median time to
	// move the bytes one prefill rank sends, by one ucp_get or one tag_lat message (one way),
	// whichever is less, plus one tag_lat round trip of 8 bytes (twice its one-way median);
	// LimitRatio is P50us over it. Present only where the limit ran.
	LimitUs    *float64 `json:"limit_us,omitempty"`
	LimitRatio *float64 `json:"limit_ratio,omitempty"`
	// LimitEngineUs is the same limit measured as the engine runs UCX: ucx_perftest with peer
	// error handling (-e) and the UCX settings of Env.UCXSettings (native.Settings), such as
	// TCP without zero-copy, where each byte is copied twice more than UCX as it comes does;
	// LimitEngineRatio is P50us over it. The first is what the wire allows, this one what
	// UCX allows with the engine's safety settings. Present only where it ran.
	LimitEngineUs    *float64 `json:"limit_engine_us,omitempty"`
	LimitEngineRatio *float64 `json:"limit_engine_ratio,omitempty"`
	// ClusterKey is true when both ends' engines held a cluster key (--cluster-key): hellos
	// sealed, and every request's claim proven.
	ClusterKey bool `json:"cluster_key,omitempty"`
	// P99FewSamples marks a p99 taken from fewer than minP99Samples requests: by nearest rank
	// it is then the slowest request, not a percentile. The table prints it with a '*'.
	P99FewSamples bool `json:"p99_few_samples,omitempty"`

	// Schema is the version of this object's layout (resultSchema); Env says where and with
	// what it was measured. Both are filled when the result is printed, so a results archive
	// can compare runs without the command line that made them.
	Schema int     `json:"schema"`
	Env    *RunEnv `json:"env,omitempty"`
}

// resultSchema is the version of Result's JSON layout. Bump it when a field changes meaning
// or goes away; adding a field does not need a bump.
const resultSchema = 2

// minP99Samples is the fewest requests for which the 99th percentile by nearest rank is not
// simply the slowest request.
const minP99Samples = 100

// RunEnv is what a results archive needs to know about the run behind a result.
type RunEnv struct {
	// Kvxfer is the module version, or the VCS revision (with "+dirty" for uncommitted
	// changes) of a binary built from a checkout; "unknown" when the build recorded neither.
	Kvxfer string `json:"kvxfer"`
	// UCX is the version of the UCX library loaded at run time.
	UCX string `json:"ucx"`
	// UCXTransports is UCX_TLS as this process saw it ("" when unset: UCX chose).
	UCXTransports string `json:"ucx_transports"`
	// UCXSettings is the UCX configuration the engines of this process ran with beyond UCX's
	// defaults (native.Settings: rendezvous scheme and threshold, keepalive, the TCP and
	// shared-memory settings), as NAME=value; scripts/bench-paths.sh gives them to the
	// ucx_perftest it compares the engine with.
	UCXSettings []string `json:"ucx_settings,omitempty"`
	Host        string   `json:"host"`
	// Cores is the number of CPUs the process may use; GoMaxProcs the Go scheduler's limit.
	Cores      int    `json:"cores"`
	GoMaxProcs int    `json:"gomaxprocs"`
	GoVersion  string `json:"go"`
	OS         string `json:"os"`
	Arch       string `json:"arch"`
	// Timestamp is when the result was printed, RFC 3339 in UTC.
	Timestamp string `json:"timestamp"`
	// GPU is the device a --memory device run used, as NVML reports it (absent for host
	// runs, and where NVML could not be asked).
	GPU *GPU `json:"gpu,omitempty"`
}

// runEnv reads the environment of this process now.
func runEnv(now time.Time) *RunEnv {
	host, _ := os.Hostname()
	env := &RunEnv{
		Kvxfer: kvxferVersion(), UCX: native.UCXVersion(), UCXTransports: os.Getenv("UCX_TLS"),
		Host: host, Cores: runtime.NumCPU(), GoMaxProcs: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(),
		OS: runtime.GOOS, Arch: runtime.GOARCH, Timestamp: now.UTC().Format(time.RFC3339),
	}
	env.UCXSettings = native.Settings()
	return env
}

// kvxferVersion is the version the Go toolchain stamped into this binary.
func kvxferVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev == "" {
		return "unknown"
	}
	return rev + dirty
}

// setBaseline records the limit the result is compared to, measured with messages (or
// copies) of size bytes.
func (r *Result) setBaseline(name string, bytes int64, gbps float64) {
	if gbps <= 0 || math.IsNaN(gbps) || math.IsInf(gbps, 0) {
		return
	}
	ratio := r.GBps / gbps
	r.Baseline, r.BaselineBytes, r.BaselineGBps, r.Ratio = name, bytes, &gbps, &ratio
}

// latencies collects per-request times and summarises them.
type latencies []time.Duration

// percentile returns the p-th percentile (0..100) by nearest rank; zero when empty.
func (l latencies) percentile(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := append(latencies(nil), l...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(rank, 0), len(s)-1)]
}

func (l latencies) mean() time.Duration {
	if len(l) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range l {
		sum += d
	}
	return sum / time.Duration(len(l))
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// gbps is bytes over d in 10^9 bytes per second.
func gbps(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) / d.Seconds() / 1e9
}

// Printer writes results as they come, as an aligned table or as JSON lines, and keeps them
// for the plot.
type Printer struct {
	w       io.Writer
	json    bool
	results []Result
}

// NewPrinter prints to w: JSON lines when json is set, else a table once Finish is called.
func NewPrinter(w io.Writer, json bool) *Printer { return &Printer{w: w, json: json} }

// Add records a result; JSON lines are printed at once so a long run shows progress in a
// pipe, the table is printed whole by flush so its columns align.
func (p *Printer) Add(r Result) error {
	r.Schema = resultSchema
	if r.Env == nil {
		r.Env = runEnv(time.Now())
	}
	r.P99FewSamples = r.Requests < minP99Samples && r.P99us > 0
	p.results = append(p.results, r)
	if p.json {
		b, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("encode result %s: %w", r.Name, err)
		}
		_, err = fmt.Fprintf(p.w, "%s\n", b)
		return err
	}
	return nil
}

// flush prints the table (nothing more in JSON mode).
func (p *Printer) flush() error {
	if p.json || len(p.results) == 0 {
		return nil
	}
	return writeTable(p.w, p.results)
}

// Finish prints the table and draws the plot into the .svg file plot, if one is named.
func (p *Printer) Finish(plot string) error {
	if err := p.flush(); err != nil {
		return err
	}
	return writePlotIfAsked(plot, p.results)
}

// writeTable prints results as tables aligned on their columns, numbers right-aligned: the
// bandwidth rows, then the latency rows (Op "latency") beside their limit.
func writeTable(w io.Writer, results []Result) error {
	var bandwidth, latency []Result
	for _, r := range results {
		if r.Op == "latency" {
			latency = append(latency, r)
		} else {
			bandwidth = append(bandwidth, r)
		}
	}
	var tables [][][]string
	if len(bandwidth) > 0 {
		tables = append(tables, bandwidthRows(bandwidth))
	}
	if len(latency) > 0 {
		tables = append(tables, latencyRows(latency))
	}
	for i, rows := range tables {
		if i > 0 {
			if _, err := io.WriteString(w, "\n"); err != nil {
				return err
			}
		}
		if err := writeAligned(w, rows); err != nil {
			return err
		}
	}
	for _, r := range results {
		if r.P99FewSamples {
			_, err := fmt.Fprintf(w, "* p99 from fewer than %d requests: the slowest of them, not a percentile\n", minP99Samples)
			return err
		}
	}
	return nil
}

// bandwidthRows are the header and rows of the bandwidth table.
func bandwidthRows(results []Result) [][]string {
	rows := [][]string{{"scenario", "bytes/req", "GB/s", "p50", "p99", "gather", "wire", "scatter", "baseline", "base GB/s", "ratio", "verified", "path"}}
	for _, r := range results {
		base, baseGB, ratio := "-", "-", "-"
		if r.BaselineGBps != nil {
			base = r.Baseline
			baseGB = fmt.Sprintf("%.2f", *r.BaselineGBps)
			ratio = fmt.Sprintf("%.2f", *r.Ratio)
		}
		rows = append(rows, []string{
			r.Name, humanBytes(r.Bytes), fmt.Sprintf("%.2f", r.GBps),
			fmtUs(r.P50us), p99Cell(r), fmtUsOrDash(r.GatherUs), fmtUsOrDash(r.WireUs),
			fmtUsOrDash(r.ScatterUs), base, baseGB, ratio, yesNo(r.Verified), orDash(r.Path),
		})
	}
	return rows
}

// latencyRows are the header and rows of the latency table: p50 and p99 beside the same-run
// limit (Result.LimitUs) and their ratios, where 1 is the wire's own time, and beside the limit
// as the engine runs UCX (Result.LimitEngineUs).
func latencyRows(results []Result) [][]string {
	rows := [][]string{{"scenario", "bytes/req", "GB/s", "p50", "p99", "p99/p50", "limit", "limit by", "p50/limit",
		"engine limit", "p50/engine", "verified", "path"}}
	for _, r := range results {
		limit, by, ratio := "-", "-", "-"
		if r.LimitUs != nil {
			limit, by, ratio = fmtUs(*r.LimitUs), r.Baseline, fmt.Sprintf("%.2f", *r.LimitRatio)
		}
		engLimit, engRatio := "-", "-"
		if r.LimitEngineUs != nil {
			engLimit, engRatio = fmtUs(*r.LimitEngineUs), fmt.Sprintf("%.2f", *r.LimitEngineRatio)
		}
		spread := "-"
		if r.P50us > 0 {
			spread = fmt.Sprintf("%.2f", r.P99us/r.P50us)
		}
		rows = append(rows, []string{
			r.Name, humanBytes(r.Bytes), fmt.Sprintf("%.2f", r.GBps), fmtUs(r.P50us), p99Cell(r),
			spread, limit, by, ratio, engLimit, engRatio, yesNo(r.Verified), orDash(r.Path),
		})
	}
	return rows
}

// writeAligned prints rows (the first the header) aligned on their columns, numbers
// right-aligned, the first column left-aligned.
func writeAligned(w io.Writer, rows [][]string) error {
	const padding = 2
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, padding, ' ', tabwriter.AlignRight)
	// tabwriter aligns every cell the same way; pad names so they read left-aligned.
	nameWidth := 0
	for _, row := range rows {
		nameWidth = max(nameWidth, len(row[0]))
	}
	for _, row := range rows {
		row[0] = fmt.Sprintf("%-*s", nameWidth, row[0])
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// Right alignment pads the first column on its left too; every line starts with the
	// same padding, so drop it.
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		if _, err := io.WriteString(w, strings.TrimPrefix(line, strings.Repeat(" ", padding))); err != nil {
			return err
		}
	}
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// p99Cell is the p99 column, marked when it came from too few requests to be a percentile.
func p99Cell(r Result) string {
	if r.P99FewSamples {
		return fmtUs(r.P99us) + "*"
	}
	return fmtUs(r.P99us) + " "
}

// fmtUs prints a latency in the unit that keeps three significant digits readable.
func fmtUs(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2f s", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.2f ms", v/1e3)
	}
	return fmt.Sprintf("%.1f us", v)
}

func fmtUsOrDash(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmtUs(v)
}

// orDash prints s, or "-" when empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writePlotIfAsked draws results into the .svg file path, when one is named.
func writePlotIfAsked(path string, results []Result) error {
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	if err := writeSVG(f, results); err != nil {
		f.Close()
		return fmt.Errorf("--plot %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--plot %s: %w", path, err)
	}
	return nil
}

// writeSVG draws results with their baselines (package plot).
func writeSVG(w io.Writer, results []Result) error { return plot.WriteSVG(w, seriesOf(results)) }

// seriesOf groups results into lines: one per operation and concurrency, each followed by its
// baseline (dashed) where one ran, points sorted by message size.
func seriesOf(results []Result) []plot.Series {
	var order []string
	byKey := map[string]*plot.Series{}
	seen := map[string]bool{}
	add := func(key, label, group string, baseline bool, p plot.Point) {
		s, ok := byKey[key]
		if !ok {
			s = &plot.Series{Label: label, Group: group, Baseline: baseline}
			byKey[key] = s
			order = append(order, key)
		}
		s.Points = append(s.Points, p)
	}
	for _, r := range results {
		if r.Op == "latency" {
			continue // a latency row's figure is its time beside a limit, not a bandwidth
		}
		key := fmt.Sprintf("%s c=%d", r.Op, r.Concurrency)
		label := r.Op
		if r.Op == "transfer" {
			label = fmt.Sprintf("transfer, %d at once", r.Concurrency)
		}
		add(key, label, label, false, plot.Point{Bytes: r.Bytes, GBps: r.GBps})
		if r.BaselineGBps != nil {
			// A baseline is drawn at the size it was measured at, once per size: one
			// ucx_perftest at the wire's message size serves every request size.
			at := r.BaselineBytes
			if at <= 0 {
				at = r.Bytes
			}
			bkey := key + " baseline " + r.Baseline
			if !seen[bkey+fmt.Sprint(at)] {
				seen[bkey+fmt.Sprint(at)] = true
				add(bkey, "  baseline: "+r.Baseline, label, true, plot.Point{Bytes: at, GBps: *r.BaselineGBps})
			}
		}
	}
	out := make([]plot.Series, 0, len(order))
	for _, k := range order {
		s := *byKey[k]
		sort.Slice(s.Points, func(i, j int) bool { return s.Points[i].Bytes < s.Points[j].Bytes })
		out = append(out, s)
	}
	return out
}
