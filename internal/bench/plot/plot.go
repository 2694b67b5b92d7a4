// SPDX-License-Identifier: Apache-2.0

// Package plot draws kvxbench's results as a self-contained SVG: bandwidth against bytes per
// request on a log scale, one line per series, each baseline dashed in its operation's
// colour.
package plot

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// Series is one line of the plot: an operation at one concurrency, or its baseline.
type Series struct {
	Label    string
	Group    string // the operation's label; a baseline shares its operation's colour
	Baseline bool   // drawn dashed
	Points   []Point
}

// Point is one measurement: bytes per request (or per message, for a baseline) and GB/s.
type Point struct {
	Bytes int64
	GBps  float64
}

// palette: one colour per operation; its baseline shares the colour, dashed.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"}

// WriteSVG draws GB/s against bytes per request (log scale) as a self-contained SVG.
func WriteSVG(w io.Writer, series []Series) error {
	if len(series) == 0 {
		return fmt.Errorf("no results to plot")
	}
	const width, height = 760.0, 460.0
	const left, right, top, bottom = 70.0, 250.0, 30.0, 60.0
	plotW, plotH := width-left-right, height-top-bottom

	minB, maxB, maxG := int64(math.MaxInt64), int64(0), 0.0
	for _, s := range series {
		for _, p := range s.Points {
			minB, maxB, maxG = min(minB, p.Bytes), max(maxB, p.Bytes), math.Max(maxG, p.GBps)
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
		fmt.Fprintf(&sb, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x(b), top+plotH+18, HumanBytes(b))
	}
	fmt.Fprintf(&sb, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, top+plotH, left+plotW, top+plotH)
	fmt.Fprintf(&sb, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, top, left, top+plotH)
	fmt.Fprintf(&sb, `<text x="%.1f" y="%.1f" text-anchor="middle">bytes per request (baselines: per message)</text>`+"\n", left+plotW/2, height-18)
	fmt.Fprintf(&sb, `<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle">GB/s</text>`+"\n", top+plotH/2)
	// Lines, markers and legend.
	colour := map[string]string{}
	for i, s := range series {
		c, ok := colour[s.Group]
		if !ok {
			c = palette[len(colour)%len(palette)]
			colour[s.Group] = c
		}
		dash := ""
		if s.Baseline {
			dash = ` stroke-dasharray="6 4"`
		}
		var pts []string
		for _, p := range s.Points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.Bytes), y(p.GBps)))
		}
		fmt.Fprintf(&sb, `<polyline class="series" data-label="%s" fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n",
			html.EscapeString(s.Label), c, dash, strings.Join(pts, " "))
		for _, p := range s.Points {
			fmt.Fprintf(&sb, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s: %s, %.2f GB/s</title></circle>`+"\n",
				x(p.Bytes), y(p.GBps), c, html.EscapeString(s.Label), HumanBytes(p.Bytes), p.GBps)
		}
		ly := top + 10 + float64(i)*18
		fmt.Fprintf(&sb, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n", width-right+15, ly, width-right+40, ly, c, dash)
		fmt.Fprintf(&sb, `<text x="%.1f" y="%.1f">%s</text>`+"\n", width-right+46, ly+4, html.EscapeString(s.Label))
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

// HumanBytes prints a byte count in binary units, as kvxbench's axes and tables show sizes.
func HumanBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
