// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/bench/plot"
	"github.com/stretchr/testify/require"
)

func sampleResults() []Result {
	a := Result{Name: "transfer llama3-8b 4k c=1", Op: "transfer", Concurrency: 1, Bytes: 512 << 20, GBps: 7.5,
		P50us: 70000, P99us: 90000, GatherUs: 1000, WireUs: 60000, ScatterUs: 1200, Verified: true, Path: "staging"}
	a.setBaseline("ucx_perftest shm", 4<<20, 8.0)
	b := Result{Name: "transfer llama3-8b 16k c=1", Op: "transfer", Concurrency: 1, Bytes: 2 << 30, GBps: 8.1,
		P50us: 260000, P99us: 300000, Verified: true, Path: "direct"}
	b.setBaseline("ucx_perftest shm", 64<<20, 8.2)
	c := Result{Name: "transfer llama3-8b 1k c=16", Op: "transfer", Concurrency: 16, Bytes: 128 << 20, GBps: 6, P50us: 300, P99us: 900}
	return []Result{a, b, c}
}

func TestTableIsAlignedWithEveryColumn(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, writeTable(&buf, sampleResults()))
	lines := strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
	require.Len(t, lines, 4)
	for _, col := range []string{"scenario", "bytes/req", "GB/s", "p50", "p99", "gather", "wire", "scatter", "baseline", "base GB/s", "ratio", "verified", "path"} {
		require.Contains(t, lines[0], col)
	}
	for _, l := range lines[1:] {
		require.Equal(t, len(lines[0]), len(l), "rows as wide as the header:\n%s", buf.String())
	}
	require.Contains(t, lines[1], "512 MiB")
	require.Contains(t, lines[1], "0.94") // 7.5 / 8.0
	require.Contains(t, lines[1], "70.00 ms")
	require.Contains(t, lines[3], "300.0 us")
	require.Regexp(t, `-\s+-\s+no\s+-\s*$`, lines[3], "no baseline, no path: dashes")
	require.Regexp(t, `yes\s+staging\s*$`, lines[1])
	require.Regexp(t, `yes\s+direct\s*$`, lines[2])
}

func TestJSONLinesHaveTheAgreedFields(t *testing.T) {
	var buf bytes.Buffer
	p := NewPrinter(&buf, true)
	for _, r := range sampleResults() {
		require.NoError(t, p.Add(r))
	}
	require.NoError(t, p.flush())
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 3)
	var withBase, without map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &withBase))
	require.NoError(t, json.Unmarshal([]byte(lines[2]), &without))
	for _, f := range []string{"name", "bytes", "gbps", "p50_us", "p99_us", "baseline_gbps", "ratio", "path"} {
		require.Contains(t, withBase, f)
	}
	require.InDelta(t, 0.9375, withBase["ratio"], 1e-9)
	require.NotContains(t, without, "ratio", "no baseline ran: no ratio")
	require.NotContains(t, without, "baseline_gbps")
}

// Each JSON line carries what a results archive needs to compare runs without their command
// line, and a p99 from too few requests says so, in the JSON and in the table.
func TestJSONLinesCarryTheRunEnvironmentAndMarkThinP99(t *testing.T) {
	var buf bytes.Buffer
	p := NewPrinter(&buf, true)
	few := sampleResults()[0]
	few.Requests = 12
	many := sampleResults()[1]
	many.Requests = 400
	require.NoError(t, p.Add(few))
	require.NoError(t, p.Add(many))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 2)
	var a, b map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &a))
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &b))
	require.EqualValues(t, resultSchema, a["schema"])
	env, ok := a["env"].(map[string]any)
	require.True(t, ok, "env object: %s", lines[0])
	for _, f := range []string{"kvxfer", "ucx", "ucx_transports", "host", "cores", "gomaxprocs", "go", "os", "arch", "timestamp"} {
		require.Contains(t, env, f)
	}
	require.NotEmpty(t, env["ucx"], "the UCX loaded")
	require.Positive(t, env["cores"])
	_, err := time.Parse(time.RFC3339, env["timestamp"].(string))
	require.NoError(t, err)
	require.Equal(t, true, a["p99_few_samples"], "12 requests cannot give a 99th percentile")
	require.NotContains(t, b, "p99_few_samples")

	var table bytes.Buffer
	require.NoError(t, writeTable(&table, p.results))
	require.Contains(t, table.String(), "90.00 ms*")
	require.NotContains(t, table.String(), "300.00 ms*")
	require.Contains(t, table.String(), "* p99 from fewer than 100 requests")
}

func TestPercentiles(t *testing.T) {
	var l latencies
	for i := 1; i <= 100; i++ {
		l = append(l, time.Duration(i)*time.Millisecond)
	}
	require.Equal(t, 50*time.Millisecond, l.percentile(50))
	require.Equal(t, 99*time.Millisecond, l.percentile(99))
	require.Equal(t, 100*time.Millisecond, l.percentile(100))
	require.Equal(t, time.Duration(0), latencies(nil).percentile(50))
	require.Equal(t, 7*time.Millisecond, latencies{7 * time.Millisecond}.percentile(99))
}

func TestPlotHasALinePerSeriesWithItsBaseline(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, writeSVG(&buf, sampleResults()))
	type polyline struct {
		Class  string `xml:"class,attr"`
		Label  string `xml:"data-label,attr"`
		Dash   string `xml:"stroke-dasharray,attr"`
		Points string `xml:"points,attr"`
	}
	var doc struct {
		Lines []polyline `xml:"polyline"`
	}
	require.NoError(t, xml.Unmarshal(buf.Bytes(), &doc), "well-formed SVG")
	require.Len(t, doc.Lines, 3, "c=1 with its baseline, c=16 without")
	require.Equal(t, "transfer, 1 at once", doc.Lines[0].Label)
	require.Len(t, strings.Fields(doc.Lines[0].Points), 2)
	require.Empty(t, doc.Lines[0].Dash)
	require.Contains(t, doc.Lines[1].Label, "ucx_perftest shm")
	require.NotEmpty(t, doc.Lines[1].Dash, "baselines are dashed")
	require.Len(t, strings.Fields(doc.Lines[2].Points), 1)

	// The baseline is drawn where it was measured (ucx_perftest at the wire's message size),
	// not at the request sizes it is compared with; one point per size measured.
	series := seriesOf(sampleResults())
	require.True(t, series[1].Baseline)
	require.Equal(t, []plot.Point{{Bytes: 4 << 20, GBps: 8.0}, {Bytes: 64 << 20, GBps: 8.2}}, series[1].Points)
	same := sampleResults()[:2]
	same[1].setBaseline("ucx_perftest shm", 4<<20, 8.0)
	series = seriesOf(same)
	require.Equal(t, []plot.Point{{Bytes: 4 << 20, GBps: 8.0}}, series[1].Points, "one baseline run serving two request sizes is one point")

	require.Error(t, writeSVG(&buf, nil))
}

func TestProgressOnlyOnATerminal(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, 10, time.Minute)
	p.step("gather")
	p.tick()
	p.done()
	require.Empty(t, buf.String(), "a buffer is not a terminal")

	now := time.Unix(0, 0)
	p = &progress{w: &buf, steps: 4, perStep: 10 * time.Second, now: func() time.Time { return now }}
	p.step("transfer 1k")
	now = now.Add(time.Minute) // a slow step counts as at most 99% of itself
	p.step("transfer 4k")
	now = now.Add(5 * time.Second)
	p.tick()
	require.Contains(t, buf.String(), "[###########...................] 2/4 transfer 4k", "1.5 of 4 steps")
	p.done()
	require.True(t, strings.HasSuffix(buf.String(), "\r"), "the bar is erased")
}
