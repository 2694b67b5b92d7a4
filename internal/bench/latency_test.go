// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/bench/perftest"
)

// A latency row's limit is the lesser of one ucp_get of the bytes and one tagged message of
// them (tag_lat's one way), plus one tag_lat round trip of 8 bytes, each ucx_perftest's median:
// the round trip is measured once, each size once.
func TestLatencyLimitIsOneMoveOfTheBytesPlusOneRoundTrip(t *testing.T) {
	var asked []perftest.Config
	// one way, as ucx_perftest reports a ping-pong: the 8-byte round trip is 5 us
	answer := func(c perftest.Config, getUs, sendUs float64) perftest.Result {
		switch {
		case c.Test == "tag_lat" && c.Size == latencyProbeBytes:
			return perftest.Result{TypicalLatencyUs: 2.5, AvgLatencyUs: 40}
		case c.Test == "tag_lat":
			return perftest.Result{TypicalLatencyUs: sendUs, AvgLatencyUs: 9000}
		case c.Test == "ucp_get":
			return perftest.Result{TypicalLatencyUs: getUs, AvgLatencyUs: 9000} // the median, not the loaded average
		}
		return perftest.Result{}
	}
	fake := func(getUs, sendUs float64) func(context.Context, perftest.Config) (perftest.Result, error) {
		return func(_ context.Context, c perftest.Config) (perftest.Result, error) {
			asked = append(asked, c)
			return answer(c, getUs, sendUs), nil
		}
	}
	m := latencyLimits{run: fake(300, 700), base: perftest.Config{Binary: "ucx_perftest", TLS: "posix,self", Timeout: time.Minute}, budget: 1 << 30}
	l, err := m.limit(context.Background(), 4<<20)
	require.NoError(t, err)
	require.InDelta(t, 305.0, l.us(), 1e-9, "shared memory: the get is the lesser")
	require.Equal(t, int64(4<<20), l.bytes)
	require.Len(t, asked, 3)
	require.Equal(t, "tag_lat", asked[0].Test)
	require.Equal(t, int64(latencyProbeBytes), asked[0].Size)
	sizes := map[string]int64{}
	for _, c := range asked[1:] {
		sizes[c.Test] = c.Size
		require.LessOrEqual(t, c.Iters, latencyMoveIters, "a median needs no more: small gets over TCP are slow")
		require.Less(t, c.Warmup, c.Iters)
	}
	require.Equal(t, map[string]int64{"ucp_get": 4 << 20, "tag_lat": 4 << 20}, sizes)
	for _, c := range asked {
		require.Equal(t, "posix,self", c.TLS, "the run's transports")
		require.Positive(t, c.Iters)
	}

	_, err = m.limit(context.Background(), 4<<20)
	require.NoError(t, err)
	require.Len(t, asked, 3, "every part measured once per run and size")
	_, err = m.limit(context.Background(), 128<<10)
	require.NoError(t, err)
	require.Len(t, asked, 5, "a new size: a get and a message more, no second round trip")

	tcp := latencyLimits{run: fake(1150, 400), budget: 1 << 20}
	l, err = tcp.limit(context.Background(), 128<<10)
	require.NoError(t, err)
	require.InDelta(t, 405.0, l.us(), 1e-9, "TCP, where UCX emulates gets: the message is the lesser")

	old := latencyLimits{run: func(_ context.Context, c perftest.Config) (perftest.Result, error) {
		return perftest.Result{AvgLatencyUs: 7}, nil
	}, budget: 1 << 20}
	l, err = old.limit(context.Background(), 1<<20)
	require.NoError(t, err)
	require.InDelta(t, 7.0+14.0, l.us(), 1e-9, "without a median, the average")

	zero := latencyLimits{run: func(context.Context, perftest.Config) (perftest.Result, error) { return perftest.Result{}, nil }, budget: 1 << 20}
	_, err = zero.limit(context.Background(), 1<<20)
	require.ErrorContains(t, err, "tag_lat")

	failing := latencyLimits{run: func(context.Context, perftest.Config) (perftest.Result, error) {
		return perftest.Result{}, errors.New("no server")
	}}
	_, err = failing.limit(context.Background(), 1<<20)
	require.ErrorContains(t, err, "no server")
}

// A latency row carries two limits, both measured: UCX as it comes (limit_us, the least the wire
// takes) and UCX as the engine runs it (limit_engine_us: peer error handling and the engine's
// settings, on both ends of every measurement); the first is never replaced by the second.
func TestLatencyLimitBothAsUCXComesAndAsTheEngineRunsIt(t *testing.T) {
	settings := []string{"UCX_RNDV_SCHEME=get_zcopy", "UCX_TCP_MAX_IOV=0", "UCX_TCP_TX_SEG_SIZE=1m"}
	cases := []struct {
		desc       string
		settings   []string
		wantLimit  float64
		wantEngine float64 // 0: none
	}{
		// UCX as it comes: a 400 us message and a 5 us round trip; as the engine runs it a
		// 900 us message (twice the copies) and a 6 us round trip.
		{desc: "an engine with UCX settings", settings: settings, wantLimit: 405, wantEngine: 906},
		{desc: "no UCX context: no settings, only the limit as UCX comes", wantLimit: 405},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			var asked []perftest.Config
			run := func(_ context.Context, c perftest.Config) (perftest.Result, error) {
				asked = append(asked, c)
				probe, move := 2.5, 400.0
				if c.ErrorHandling {
					probe, move = 3, 900
				}
				switch {
				case c.Test == "tag_lat" && c.Size == latencyProbeBytes:
					return perftest.Result{TypicalLatencyUs: probe}, nil
				case c.Test == "tag_lat":
					return perftest.Result{TypicalLatencyUs: move}, nil
				}
				return perftest.Result{TypicalLatencyUs: 5 * move}, nil // TCP: emulated gets
			}
			base := perftest.Config{Binary: "ucx_perftest", TLS: "tcp,self", Timeout: time.Minute}
			limits := newRunLimits(run, base, 1<<30, tc.settings)
			res := Result{Op: "latency", P50us: 1812}
			require.NoError(t, limits.set(context.Background(), &res, 4<<20, "tcp,self"))

			require.NotNil(t, res.LimitUs)
			require.InDelta(t, tc.wantLimit, *res.LimitUs, 1e-9)
			require.InDelta(t, 1812/tc.wantLimit, *res.LimitRatio, 1e-9)
			require.Equal(t, "move+rtt tcp,self", res.Baseline)
			var asEngine int
			for _, c := range asked {
				require.Equal(t, "tcp,self", c.TLS)
				if c.ErrorHandling {
					asEngine++
					require.Equal(t, tc.settings, c.Env, "%s %d: the engine's settings", c.Test, c.Size)
				} else {
					require.Empty(t, c.Env, "%s %d: UCX as it comes", c.Test, c.Size)
				}
			}
			if tc.wantEngine == 0 {
				require.Nil(t, res.LimitEngineUs)
				require.Zero(t, asEngine)
				return
			}
			require.Equal(t, 3, asEngine, "the round trip, the get and the message, as the engine")
			require.Len(t, asked, 6)
			require.NotNil(t, res.LimitEngineUs)
			require.InDelta(t, tc.wantEngine, *res.LimitEngineUs, 1e-9)
			require.InDelta(t, 1812/tc.wantEngine, *res.LimitEngineRatio, 1e-9)

			var obj map[string]any
			b, err := json.Marshal(res)
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(b, &obj))
			require.InDelta(t, tc.wantLimit, obj["limit_us"], 1e-9)
			require.InDelta(t, tc.wantEngine, obj["limit_engine_us"], 1e-9)
			require.InDelta(t, 1812/tc.wantEngine, obj["limit_engine_ratio"], 1e-9)

			require.NoError(t, limits.set(context.Background(), &res, 4<<20, "tcp,self"))
			require.Len(t, asked, 6, "each limit's parts measured once per run and size")
		})
	}

	failing := newRunLimits(func(_ context.Context, c perftest.Config) (perftest.Result, error) {
		if c.ErrorHandling {
			return perftest.Result{}, errors.New("server aborted")
		}
		return perftest.Result{TypicalLatencyUs: 10}, nil
	}, perftest.Config{}, 1<<20, settings)
	res := Result{Op: "latency", P50us: 100}
	err := failing.set(context.Background(), &res, 1<<20, "tcp,self")
	require.ErrorContains(t, err, "as the engine runs UCX")
	require.ErrorContains(t, err, "server aborted")
}

// With --latency the driver adds the latency rows after the others: a 32-token request and one
// block's first layer, at concurrency 1 and 16, every byte checked, one prefill rank or two.
func TestDriverMeasuresTheLatencyRows(t *testing.T) {
	skipWithoutHostCopy(t)
	for _, tp := range []int{1, 2} {
		t.Run(map[int]string{1: "prefill-tp=1", 2: "prefill-tp=2"}[tp], func(t *testing.T) {
			cfg := smallRun(t, func(s *runSpec) { s.prefillTP, s.prompts, s.concurrency, s.latency = tp, []int64{64}, []int{1}, true })
			n := &fakeNet{slot: cfg.SlotBytes, sends: map[fakeKey]*fakeOp{}, recvs: map[fakeKey]*fakeOp{}}
			out, err := runFake(t, cfg, n, Output{JSON: true, Duration: 20 * time.Millisecond, MaxIters: 20})
			require.NoError(t, err)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			require.Len(t, lines, 5, "one transfer row, four latency rows")
			block := int64(4 * 2 * 8 * 32 * 128 * 2) // 4 layers, K and V, 8 heads, 32 tokens, 128 dims, BF16
			want := []struct {
				name   string
				bytes  int64
				layers int64
				conc   int
			}{
				{"latency custom(llama3-8b) 32 c=1", block, 0, 1},
				{"latency custom(llama3-8b) 32 c=16", block, 0, 16},
				{"latency custom(llama3-8b) 1 block, 1 layer c=1", block / 4, 1, 1},
				{"latency custom(llama3-8b) 1 block, 1 layer c=16", block / 4, 1, 16},
			}
			for i, w := range want {
				var r Result
				require.NoError(t, json.Unmarshal([]byte(lines[i+1]), &r))
				require.Equal(t, "latency", r.Op)
				require.True(t, strings.HasPrefix(r.Name, w.name), r.Name)
				require.Equal(t, w.bytes, r.Bytes, r.Name)
				require.Equal(t, w.layers, r.Layers, r.Name)
				require.Equal(t, w.conc, r.Concurrency, r.Name)
				require.True(t, r.Verified, r.Name)
				require.GreaterOrEqual(t, r.Requests, minIters, r.Name)
				require.Positive(t, r.P50us, r.Name)
				require.Nil(t, r.LimitUs, "no ucx_perftest in this run: no limit")
			}
			require.Empty(t, n.sends, "every send matched")
			require.Empty(t, n.recvs, "every receive matched")
		})
	}
}

// A pool sized with the latency rows holds their 16 requests at once, even when the prompts
// asked for hold fewer blocks.
func TestSizePoolsHoldsTheLatencyRows(t *testing.T) {
	p, err := FindPreset("llama3-8b")
	require.NoError(t, err)
	s := Shape{Name: p.Name, Dims: p.Dims, Order: p.Order}
	_, without, err := SizePools(s, []int64{32}, []int{1}, 1, 1, 8<<30, 0, false)
	require.NoError(t, err)
	require.Less(t, without.NumBlocks, int64(16))
	_, with, err := SizePools(s, []int64{32}, []int{1}, 1, 1, 8<<30, 0, true)
	require.NoError(t, err)
	require.GreaterOrEqual(t, with.NumBlocks, int64(16))
}

// Latency rows print in a table of their own, beside their limit: p50 over the limit, p99
// over p50; their JSON carries limit_us and limit_ratio, and the plot leaves them out.
func TestLatencyRowsPrintBesideTheirLimit(t *testing.T) {
	lat := Result{Name: "latency llama3-8b 32 c=1", Op: "latency", Concurrency: 1, Bytes: 4 << 20, GBps: 3,
		P50us: 1300, P99us: 2600, Verified: true, Path: "rma", Requests: 500}
	lim := latencyLimit{moveUs: 400, roundTripUs: 100, bytes: 4 << 20}
	lat.setLimit(lim.name("posix,cma,self"), lim)
	lat.setEngineLimit(latencyLimit{moveUs: 600, roundTripUs: 50, bytes: 4 << 20})
	none := Result{Name: "latency llama3-8b 1 block, 1 layer c=16", Op: "latency", Concurrency: 16, Bytes: 128 << 10,
		GBps: 1, P50us: 90, P99us: 300, Layers: 1, Requests: 500}
	results := append(sampleResults(), lat, none)

	var buf bytes.Buffer
	require.NoError(t, writeTable(&buf, results))
	tables := strings.Split(strings.TrimRight(buf.String(), "\n"), "\n\n")
	require.Len(t, tables, 2, "the bandwidth table, then the latency table:\n%s", buf.String())
	require.NotContains(t, tables[0], "latency ")
	lines := strings.Split(tables[1], "\n")
	require.Len(t, lines, 3)
	for _, col := range []string{"scenario", "bytes/req", "p50", "p99", "p99/p50", "limit", "limit by", "p50/limit", "engine limit", "p50/engine", "verified", "path"} {
		require.Contains(t, lines[0], col)
	}
	for _, l := range lines[1:] {
		require.Equal(t, len(lines[0]), len(l), "rows as wide as the header:\n%s", tables[1])
	}
	require.Regexp(t, `1\.30 ms\s+2\.60 ms\s+2\.00\s+500\.0 us\s+move\+rtt posix,cma,self\s+2\.60\s+650\.0 us\s+2\.00\s+yes\s+rma\s*$`, lines[1])
	require.Regexp(t, `300\.0 us\s+3\.33\s+-\s+-\s+-\s+-\s+-\s+no\s+-\s*$`, lines[2], "no limit ran: dashes")

	buf.Reset()
	p := NewPrinter(&buf, true)
	require.NoError(t, p.Add(lat))
	var obj map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &obj))
	require.Equal(t, "latency", obj["op"])
	require.InDelta(t, 500.0, obj["limit_us"], 1e-9)
	require.InDelta(t, 2.6, obj["limit_ratio"], 1e-9)
	require.InDelta(t, 650.0, obj["limit_engine_us"], 1e-9)
	require.InDelta(t, 2.0, obj["limit_engine_ratio"], 1e-9)
	require.NotContains(t, obj, "ratio", "a latency row has no bandwidth ratio")

	for _, s := range seriesOf(results) {
		require.NotContains(t, s.Label, "latency")
	}
}
