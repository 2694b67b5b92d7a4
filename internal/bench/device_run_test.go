// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/internal/bench/perftest"
	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
)

func TestDeviceRun_PerftestMovesDeviceMemory(t *testing.T) {
	host := perftest.Config{Test: "tag_bw", Size: 4096, Iters: 10, Warmup: 1}
	require.NotContains(t, host.Args(1234), "-m")
	dev := host
	dev.MemType = "cuda"
	args := dev.Args(1234)
	require.Equal(t, []string{"-m", "cuda"}, args[len(args)-2:])

	// The baseline moves the same kind of memory as the run.
	require.Equal(t, "", perftestMemType(RunConfig{Memory: "host"}))
	require.Equal(t, "cuda", perftestMemType(RunConfig{Memory: "device"}))
}

// Without a GPU (or its libraries), --memory device stops before any peer starts, with one
// line that says what is missing and how a GPU host runs it.
func TestDeviceRun_NoGPUIsOneLine(t *testing.T) {
	saved := openCUDA
	t.Cleanup(func() { openCUDA = saved })
	openCUDA = func(int) (*cuda.Runtime, error) {
		return nil, fmt.Errorf("%w: the driver reports 0 devices\n(second line)", cuda.ErrNoDevice)
	}
	cfg := runFor(t, runSpec{memory: "device", prompts: []int64{64}, concurrency: []int{1}, memCap: 256 << 20, layers: 2})

	err := checkDeviceRun(cfg, false)
	require.Error(t, err)
	if errors.Is(err, errDeviceNotBuilt) {
		return // a build without cgo says so first
	}
	msg := err.Error()
	require.NotContains(t, msg, "\n", "one line")
	require.Contains(t, msg, "no usable GPU")
	require.Contains(t, msg, "0 devices")
	require.Contains(t, msg, "make gpu-test", "the fix is named")

	var ue *UsageError
	require.ErrorAs(t, checkDeviceRun(cfg, true), &ue, "--stream has no device mode")
	cfg.Memory = "host"
	require.NoError(t, checkDeviceRun(cfg, false), "host runs are not probed")
}

// With a GPU but a UCX that cannot reach CUDA memory (Debian's), the probe names the UCX and
// the fix. The runtime here is a stand-in: the probe only opens and closes it.
func TestDeviceRun_UCXWithoutCUDAIsOneLine(t *testing.T) {
	if !engineBuilt {
		t.Skip("a build without cgo has no UCX to probe (TestDeviceRun_NoGPUIsOneLine covers its error)")
	}
	saved := openCUDA
	t.Cleanup(func() { openCUDA = saved })
	openCUDA = func(int) (*cuda.Runtime, error) { return new(cuda.Runtime), nil }
	cfg := runFor(t, runSpec{memory: "device", prompts: []int64{64}, concurrency: []int{1}, memCap: 256 << 20, layers: 2, tls: "posix,cma,self"})
	err := checkDeviceRun(cfg, false)
	if err == nil {
		t.Skip("this UCX reaches CUDA memory: make gpu-test runs the device transfer")
	}
	msg := err.Error()
	require.NotContains(t, msg, "\n", "one line")
	require.Contains(t, msg, "UCX cannot move device memory")
	require.Contains(t, msg, "libucx-cu12")
	require.True(t, strings.HasPrefix(msg, "--memory device:"), msg)
}

// mirrorEngine stands in for the device engine side without a GPU: each pool the scenario
// sees is a host mirror, and the engine moves a second buffer (the "device" pool) that only
// PushPool, ScrubPlan and PullPlan connect to it. A driver that forgets one of them checks
// stale bytes and fails; broken, when set, drops every pull.
type mirrorEngine struct {
	*engineAdapter
	mu     sync.Mutex
	device map[*byte][]byte
	broken bool
}

func (e *mirrorEngine) NewPool(n int64) ([]byte, bool, error) {
	host, dev := make([]byte, n), make([]byte, n)
	fillPattern(dev, 99) // what the device held before: never what a check expects
	e.mu.Lock()
	e.device[unsafe.SliceData(host)] = dev
	e.mu.Unlock()
	return host, false, nil
}

func (e *mirrorEngine) dev(pool []byte) []byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.device[unsafe.SliceData(pool)]
}

// eachRun calls f with the pool range of each run of p's stream, as streamChecksum walks it.
func eachRun(p *layout.Plan, f func(off, n int64)) {
	run := kvplan.RunUnits(p)
	runBytes := run * p.Layout().RowBytes()
	for u := int64(0); u < kvplan.Units(p); u += run {
		f(kvplan.UnitOffset(p, u), runBytes)
	}
}

func (e *mirrorEngine) PushPool(pool []byte) error { copy(e.dev(pool), pool); return nil }

func (e *mirrorEngine) ScrubPlan(p *layout.Plan, pool []byte) error {
	dev := e.dev(pool)
	eachRun(p, func(off, n int64) { clear(dev[off : off+n]) })
	return nil
}

func (e *mirrorEngine) PullPlan(p *layout.Plan, pool []byte) error {
	if e.broken {
		return nil
	}
	dev := e.dev(pool)
	eachRun(p, func(off, n int64) { copy(pool[off:off+n], dev[off:off+n]) })
	return nil
}

func (e *mirrorEngine) Send(ctx context.Context, id uint64, secret []byte, to peerRef, p *layout.Plan, m mover) (pendingXfer, error) {
	return e.engineAdapter.Send(ctx, id, secret, to, p, &timedMover{pool: e.dev(m.(*timedMover).pool)})
}

func (e *mirrorEngine) Receive(ctx context.Context, id uint64, secret []byte, subs []recvSub, m mover) (pendingXfer, error) {
	return e.engineAdapter.Receive(ctx, id, secret, subs, &timedMover{pool: e.dev(m.(*timedMover).pool)})
}

// The driver with --memory device keeps the host mirrors and the pools the engine moves in
// step: every scenario verified, and the path column says device staging. With the pull
// broken, the checks catch it.
func TestDeviceRun_DriverKeepsMirrorsInStep(t *testing.T) {
	skipWithoutHostCopy(t)
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken pull=%v", broken), func(t *testing.T) {
			cfg := smallRun(t, func(s *runSpec) { s.memory, s.prefillTP = "device", 2 })
			decode, prefill := memEngines(t, cfg)
			wrap := func(e engineSide) engineSide {
				return &mirrorEngine{engineAdapter: e.(*engineAdapter), device: map[*byte][]byte{}, broken: broken}
			}
			for i := range prefill {
				prefill[i] = wrap(prefill[i])
			}
			var results []Result
			err := runDriver(t, cfg, wrap(decode), prefill, Output{Duration: 20 * time.Millisecond, MaxIters: 10},
				func(r Result) error { results = append(results, r); return nil })
			if broken {
				require.ErrorContains(t, err, "verification failed")
				return
			}
			require.NoError(t, err)
			require.Len(t, results, 4)
			for _, r := range results {
				require.True(t, r.Verified, r.Name)
				require.Equal(t, "device staging", r.Path, r.Name)
				require.True(t, strings.HasSuffix(r.Name, " device"), r.Name)
			}
		})
	}
}

// A device run's JSON results describe the GPU it ran on (env.gpu, as NVML reported it when
// --device was resolved); a host run's do not.
func TestDeviceRun_ResultsDescribeTheGPU(t *testing.T) {
	skipWithoutHostCopy(t)
	gpu := &GPU{Index: 3, Name: "NVIDIA H100 80GB HBM3", Driver: "550.54.15", MemoryBytes: 80 << 30, FreeBytes: 79 << 30}
	for _, described := range []bool{true, false} {
		t.Run(fmt.Sprintf("described=%v", described), func(t *testing.T) {
			cfg := smallRun(t, func(s *runSpec) { s.prompts, s.concurrency = []int64{64}, []int{1} })
			if described {
				cfg.GPU = gpu
			}
			n := &fakeNet{slot: cfg.SlotBytes, sends: map[fakeKey]*fakeOp{}, recvs: map[fakeKey]*fakeOp{}}
			out, err := runFake(t, cfg, n, Output{JSON: true, Duration: 10 * time.Millisecond, MaxIters: 10})
			require.NoError(t, err)
			var r struct {
				Env struct {
					GPU *GPU `json:"gpu"`
				} `json:"env"`
			}
			require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &r))
			if !described {
				require.Nil(t, r.Env.GPU)
				return
			}
			require.Equal(t, gpu, r.Env.GPU)
		})
	}
}
