// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// checkPlotPath refuses a --plot file kvxbench cannot draw, before anything is measured.
func checkPlotPath(path string) error {
	if path == "" {
		return nil
	}
	if !strings.EqualFold(filepath.Ext(path), ".svg") {
		return usagef("--plot %q: only .svg is drawn (open it in a browser, or convert it with rsvg-convert)", path)
	}
	return nil
}

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

// plotSeries is one line of the plot: an operation at one concurrency, or its baseline.
type plotSeries struct {
	label    string
	group    string // the operation's label; a baseline shares its operation's colour
	baseline bool
	points   []plotPoint
}

type plotPoint struct {
	bytes int64
	gbps  float64
}

// seriesOf groups results into lines: one per operation and concurrency, each followed by its
// baseline (dashed) where one ran, points sorted by message size.
func seriesOf(results []Result) []plotSeries {
	var order []string
	byKey := map[string]*plotSeries{}
	seen := map[string]bool{}
	add := func(key, label, group string, baseline bool, p plotPoint) {
		s, ok := byKey[key]
		if !ok {
			s = &plotSeries{label: label, group: group, baseline: baseline}
			byKey[key] = s
			order = append(order, key)
		}
		s.points = append(s.points, p)
	}
	for _, r := range results {
		key := fmt.Sprintf("%s c=%d", r.Op, r.Concurrency)
		label := r.Op
		if r.Op == "transfer" {
			label = fmt.Sprintf("transfer, %d at once", r.Concurrency)
		}
		add(key, label, label, false, plotPoint{r.Bytes, r.GBps})
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
				add(bkey, "  baseline: "+r.Baseline, label, true, plotPoint{at, *r.BaselineGBps})
			}
		}
	}
	out := make([]plotSeries, 0, len(order))
	for _, k := range order {
		s := *byKey[k]
		sort.Slice(s.points, func(i, j int) bool { return s.points[i].bytes < s.points[j].bytes })
		out = append(out, s)
	}
	return out
}

// palette: one colour per operation; its baseline shares the colour, dashed.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"}

// writeSVG draws GB/s against bytes per request (log scale) as a self-contained SVG.
func writeSVG(w io.Writer, results []Result) error {
	series := seriesOf(results)
	if len(series) == 0 {
		return fmt.Errorf("no results to plot")
	}
	const width, height = 760.0, 460.0
	const left, right, top, bottom = 70.0, 250.0, 30.0, 60.0
	plotW, plotH := width-left-right, height-top-bottom

	minB, maxB, maxG := int64(math.MaxInt64), int64(0), 0.0
	for _, s := range series {
		for _, p := range s.points {
			minB, maxB, maxG = min(minB, p.bytes), max(maxB, p.bytes), math.Max(maxG, p.gbps)
		}
	}
	lo, hi := math.Log2(float64(minB)), math.Log2(float64(maxB))
	if hi-lo < 1 {
		lo, hi = lo-0.5, hi+0.5
	}
	yMax := niceCeil(maxG * 1.1)
	x := func(b int64) float64 { return left + (math.Log2(float64(b))-lo)/(hi-lo)*plotW }
	y := func(g float64) float64 { return top + plotH - g/yMax*plotH }

	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&sb, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&sb, `<text x="%.0f" y="18" font-size="14">kvxbench: bandwidth against request size; baselines at the message size they were measured at</text>`+"\n", left)
	// Axes and grid.
	fmt.Fprintf(&sb, `<g stroke="#ccc">`+"\n")
	for i := 0; i <= 5; i++ {
		g := yMax * float64(i) / 5
		fmt.Fprintf(&sb, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`+"\n", left, y(g), left+plotW, y(g))
	}
	fmt.Fprintf(&sb, "</g>\n")
	for i := 0; i <= 5; i++ {
		g := yMax * float64(i) / 5
		fmt.Fprintf(&sb, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(g)+4, trimFloat(g))
	}
	for e := math.Ceil(lo); e <= math.Floor(hi); e++ {
		b := int64(1) << int(e)
		fmt.Fprintf(&sb, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#888"/>`+"\n", x(b), top+plotH, x(b), top+plotH+5)
		fmt.Fprintf(&sb, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x(b), top+plotH+18, humanBytes(b))
	}
	fmt.Fprintf(&sb, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, top+plotH, left+plotW, top+plotH)
	fmt.Fprintf(&sb, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, top, left, top+plotH)
	fmt.Fprintf(&sb, `<text x="%.1f" y="%.1f" text-anchor="middle">bytes per request (baselines: per message)</text>`+"\n", left+plotW/2, height-18)
	fmt.Fprintf(&sb, `<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle">GB/s</text>`+"\n", top+plotH/2)
	// Lines, markers and legend.
	colour := map[string]string{}
	for i, s := range series {
		c, ok := colour[s.group]
		if !ok {
			c = palette[len(colour)%len(palette)]
			colour[s.group] = c
		}
		dash := ""
		if s.baseline {
			dash = ` stroke-dasharray="6 4"`
		}
		var pts []string
		for _, p := range s.points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.bytes), y(p.gbps)))
		}
		fmt.Fprintf(&sb, `<polyline class="series" data-label="%s" fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n",
			html.EscapeString(s.label), c, dash, strings.Join(pts, " "))
		for _, p := range s.points {
			fmt.Fprintf(&sb, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s: %s, %.2f GB/s</title></circle>`+"\n",
				x(p.bytes), y(p.gbps), c, html.EscapeString(s.label), humanBytes(p.bytes), p.gbps)
		}
		ly := top + 10 + float64(i)*18
		fmt.Fprintf(&sb, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n", width-right+15, ly, width-right+40, ly, c, dash)
		fmt.Fprintf(&sb, `<text x="%.1f" y="%.1f">%s</text>`+"\n", width-right+46, ly+4, html.EscapeString(s.label))
	}
	sb.WriteString("</svg>\n")
	_, err := io.WriteString(w, sb.String())
	return err
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten, so axis labels are round.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}
