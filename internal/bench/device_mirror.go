// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"errors"
	"fmt"

	"github.com/kvxfer/kvxfer/layout"
)

// poolMirror is implemented by an engine side whose KV pools live in device memory
// (--memory device): the []byte pool the scenario fills, scrubs and checks is then a host
// mirror of the device pool. The prefill pool is pushed whole once, after its fill; between
// rounds, only the blocks of each request's plan move: zeroed on the GPU after the host scrub,
// pulled back before the host checks. All of it happens off the clock.
type poolMirror interface {
	// PushPool copies the whole host mirror pool into its device pool.
	PushPool(pool []byte) error
	// ScrubPlan zeroes p's bytes of the device pool behind pool.
	ScrubPlan(p *layout.Plan, pool []byte) error
	// PullPlan copies p's bytes of the device pool into the host mirror pool.
	PullPlan(p *layout.Plan, pool []byte) error
}

// pushPool pushes pool to the GPU when eng keeps its pools there; a no-op otherwise.
func pushPool(eng engineSide, pool []byte) error {
	if m, ok := eng.(poolMirror); ok {
		return m.PushPool(pool)
	}
	return nil
}

// scrubPlans zeroes the plans' blocks on the GPU when eng keeps its pools there (the host
// mirror was scrubbed by the caller); a no-op otherwise.
func scrubPlans(eng engineSide, plans [][]recvSub, pool []byte) error {
	m, ok := eng.(poolMirror)
	for i := 0; ok && i < len(plans); i++ {
		for _, sub := range plans[i] {
			if err := m.ScrubPlan(sub.plan, pool); err != nil {
				return err
			}
		}
	}
	return nil
}

// pullPlans copies the plans' blocks back from the GPU into the host mirror when eng keeps
// its pools there; a no-op otherwise.
func pullPlans(eng engineSide, plans [][]recvSub, pool []byte) error {
	m, ok := eng.(poolMirror)
	for i := 0; ok && i < len(plans); i++ {
		for _, sub := range plans[i] {
			if err := m.PullPlan(sub.plan, pool); err != nil {
				return err
			}
		}
	}
	return nil
}

// errDeviceNotBuilt: --memory device in a build without cgo, which has no UCX transport.
var errDeviceNotBuilt = errors.New("--memory device: this kvxbench has no UCX transport (it needs cgo: build with CGO_ENABLED=1)")

// CheckDeviceRun refuses --memory device, in one line and before any peer starts, where this
// host or this build cannot run it; stream is run --stream, which has no device mode.
func CheckDeviceRun(cfg RunConfig, stream bool) error { return checkDeviceRun(cfg, stream) }

// checkDeviceRun refuses --memory device, in one line and before any peer starts, where it
// cannot run: no GPU, no libkvxcuda.so, or a UCX without CUDA support. device_engine.go (cgo)
// replaces it with the real probe; stream is the --stream mode, which device memory lacks.
var checkDeviceRun = func(cfg RunConfig, stream bool) error {
	if cfg.Memory != "device" {
		return nil
	}
	return errDeviceNotBuilt
}

// deviceStreamErr is the --stream refusal, shared by both builds.
func deviceStreamErr() error {
	return Usagef("--memory device with --stream: the streaming measurement runs on host memory only")
}

// perftestMemType is ucx_perftest's -m for the run's memory: "cuda" for --memory device, so
// the baseline moves device memory between the same two processes' kind of buffers.
func perftestMemType(cfg RunConfig) string {
	if cfg.Memory == "device" {
		return "cuda"
	}
	return ""
}

// deviceRunHint is appended to the probe's errors: how a GPU host gets a CUDA-enabled UCX.
const deviceRunHint = "on a GPU host, `make gpu-test` builds kvxbench against the libucx-cu12 wheel (scripts/ucx-cuda.sh) and runs this"

func deviceRunErr(what string, err error) error {
	return fmt.Errorf("--memory device: %s: %v; %s", what, err, deviceRunHint)
}
