// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer"
)

// TestMain lets the test binary stand in for kvxbench when Loopback re-executes it as its peer
// (PeerEnv set): it serves as the peer with the arguments instead of running the tests.
func TestMain(m *testing.M) {
	if os.Getenv(PeerEnv) == "1" {
		os.Exit(servePeerForTest(os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

// servePeerForTest is kvxbench's hidden peer subcommand: args are "peer" and the flags
// startPeers wrote.
func servePeerForTest(args []string) int {
	if len(args) == 0 || args[0] != "peer" {
		fmt.Fprintf(os.Stderr, "test peer: want the peer subcommand, got %q\n", args)
		return 2
	}
	var a PeerArgs
	fs := flag.NewFlagSet("peer", flag.ContinueOnError)
	a.Register(fs)
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if err := Peer(context.Background(), a); err != nil {
		fmt.Fprintf(os.Stderr, "kvxbench: %v\n", err)
		return 1
	}
	return 0
}

// runSpec is what a test changes from the defaults of `kvxbench run` (cmd/kvxbench resolves
// the same configuration from flags); zero fields keep the default.
type runSpec struct {
	layers         int64
	prompts        []int64
	concurrency    []int
	prefillTP      int
	decodeTP       int
	order          layout.Order
	slotBytes      int64
	memCap         int64
	pool           string
	memory         string
	tls            string
	http           string
	decodeOrder    layout.Order
	staging        bool
	noRMA          bool
	latency        bool
	connectTimeout time.Duration
	clusterKey     bool // a fresh key in a file (--cluster-key)
	sender         string
	rmaEmulated    bool
}

// runFor is the RunConfig of s on the llama3-8b preset, as `kvxbench run` resolves it.
func runFor(t *testing.T, s runSpec) RunConfig {
	t.Helper()
	p, err := FindPreset("llama3-8b")
	require.NoError(t, err)
	shape := Shape{Name: p.Name, Dims: p.Dims, Order: p.Order}
	if s.layers != 0 {
		shape.Dims.NumLayers, shape.Name = s.layers, "custom("+p.Name+")"
	}
	if s.order != 0 {
		shape.Order = s.order
		if s.decodeOrder == 0 {
			s.decodeOrder = s.order
		}
	}
	or := func(v, def int64) int64 {
		if v == 0 {
			return def
		}
		return v
	}
	cfg := RunConfig{ShapeName: shape.Name, MemCap: or(s.memCap, 8<<30), Dims: shape.Dims, Order: shape.Order,
		Prompts: s.prompts, Concurrency: s.concurrency, SlotBytes: or(s.slotBytes, 4<<20), PipelineDepth: 2,
		TLS: s.tls, PrefillTP: int(or(int64(s.prefillTP), 1)), DecodeTP: int(or(int64(s.decodeTP), 1)), Duration: time.Second, MaxIters: 10000, Verify: true,
		ConnectTimeout: time.Duration(or(int64(s.connectTimeout), int64(10*time.Second))), Seed: 1,
		Staging: s.staging, DirectChunkBytes: 64 << 20, NoRMA: s.noRMA, Pool: s.pool, Memory: s.memory, HTTP: s.http,
		Latency: s.latency, Sender: s.sender, RMAWhereEmulated: s.rmaEmulated}
	if cfg.Prompts == nil {
		cfg.Prompts = []int64{1 << 10, 4 << 10, 16 << 10}
	}
	if cfg.Concurrency == nil {
		cfg.Concurrency = []int{1, 16}
	}
	if cfg.Sender == "" {
		cfg.Sender = SenderAfter
	}
	if cfg.Pool == "" {
		cfg.Pool = "transport"
	}
	if cfg.Memory == "" {
		cfg.Memory = "host"
	}
	cfg.Prefill, cfg.Decode, err = SizePools(shape, cfg.Prompts, cfg.Concurrency, cfg.PrefillTP, cfg.DecodeTP, cfg.MemCap, 0, cfg.Latency)
	require.NoError(t, err)
	if s.decodeOrder != cfg.Order {
		cfg.Decode = layout.Packed(cfg.Decode.Dims(), s.decodeOrder)
	}
	if s.clusterKey {
		cfg.ClusterKeyFile = filepath.Join(t.TempDir(), "cluster.key")
		key := make([]byte, transfer.ClusterKeyBytes)
		_, _ = rand.Read(key)
		require.NoError(t, os.WriteFile(cfg.ClusterKeyFile, []byte(hex.EncodeToString(key)+"\n"), 0o600))
		cfg.ClusterKey, err = ReadClusterKey(cfg.ClusterKeyFile)
		require.NoError(t, err)
	}
	return cfg
}

// smallRun is a run configuration small enough for tests: a 4-layer Llama-shaped pool, two
// prompts by two concurrencies; edit changes it further.
func smallRun(t *testing.T, edit ...func(*runSpec)) RunConfig {
	t.Helper()
	s := runSpec{layers: 4, prompts: []int64{64, 128}, concurrency: []int{1, 4}, slotBytes: 256 << 10, memCap: 1 << 30}
	for _, e := range edit {
		e(&s)
	}
	return runFor(t, s)
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// skipWithoutHostCopy skips a test that moves bytes through native.HostGather in a build
// without cgo, where the C copy is absent (native.ErrNotSupported); any other error fails.
func skipWithoutHostCopy(t *testing.T) {
	t.Helper()
	l := layouttest.Llama3_8B(1)
	p, err := layout.NewPlan(l, l.All(), []int32{0})
	require.NoError(t, err)
	err = native.HostGather(p, make([]byte, l.SpanBytes()), 0, make([]byte, 1))
	if errors.Is(err, native.ErrNotSupported) {
		t.Skipf("this build has no host gather: %v", err)
	}
	require.NoError(t, err)
}
