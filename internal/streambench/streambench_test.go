// SPDX-License-Identifier: Apache-2.0

package streambench

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// small is a 4-layer model with 64 tokens, so the whole run takes milliseconds under -race.
var small = Config{
	Dims:   layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 2, HeadDim: 16, ElemSize: 2, TokensPerBlock: 4},
	Tokens: 64, Runs: 2, Timeout: 10 * time.Second,
	Engine: transfer.Config{SlotBytes: 2048, MaxConcurrent: 2},
}

func TestRunReportsExposedBesidePlain(t *testing.T) {
	cases := []struct {
		desc string
		cfg  func(Config) Config
	}{
		{"compute balanced by measurement", func(c Config) Config { return c }},
		{"fixed busy compute", func(c Config) Config { c.LayerCompute, c.BusyCompute = 2*time.Millisecond, true; return c }},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			r, err := Run(context.Background(), c.cfg(small))
			require.NoError(t, err) // Run also checks the receiver's pool equals the sender's
			require.Positive(t, r.PlainUS)
			require.Positive(t, r.ExposedUS)
			require.InDelta(t, r.ExposedUS/r.PlainUS, r.ExposedRatio, 1e-9)
			require.Equal(t, int64(4*2*2*16*2*64), r.Bytes)
			require.GreaterOrEqual(t, r.StreamUS, r.LayerComputeUS*4, "the streamed run includes the compute")
			b, err := json.Marshal(r)
			require.NoError(t, err)
			var fields map[string]any
			require.NoError(t, json.Unmarshal(b, &fields))
			for _, k := range []string{"exposed_us", "plain_us", "exposed_ratio"} {
				require.Contains(t, fields, k)
			}
		})
	}
}

func TestConfigIsValidatedWithTheFieldNamed(t *testing.T) {
	cases := []struct {
		desc  string
		cfg   Config
		field string
	}{
		{"negative tokens", Config{Tokens: -1}, "Tokens"},
		{"negative compute", Config{LayerCompute: -time.Second}, "LayerCompute"},
		{"negative runs", Config{Runs: -1}, "Runs"},
		{"unknown transport", Config{Transport: "carrier-pigeon"}, "Transport"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			_, err := Run(context.Background(), c.cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.Contains(t, err.Error(), c.field)
		})
	}
}

// BenchmarkStream is the measurement: the Llama-3-8B-shaped pool, 4096 tokens, 32
// layers, per-layer compute equal to the measured plain per-layer transfer time.
func BenchmarkStream(b *testing.B) {
	for _, tr := range []string{TransportMem, TransportUCX} {
		b.Run(tr, func(b *testing.B) {
			var r Result
			for i := 0; i < b.N; i++ {
				var err error
				r, err = Run(context.Background(), Config{Transport: tr, Runs: 5})
				if errors.Is(err, ErrNoUCX) {
					b.Skipf("no UCX in this build: %v", err)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(r.ExposedUS, "exposed_us")
			b.ReportMetric(r.PlainUS, "plain_us")
			b.ReportMetric(r.ExposedRatio, "exposed_ratio")
			j, _ := json.Marshal(r)
			b.Logf("%s", j)
		})
	}
}
