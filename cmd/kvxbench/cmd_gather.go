// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/kvxfer/kvxfer/internal/bench"
)

// gatherFlags are the flags of `kvxbench gather`.
type gatherFlags struct {
	layout   layoutFlags
	out      outputFlags
	prompts  string
	slotSize string
	memory   string
	device   string
	seed     uint64
}

func cmdGather(ctx context.Context, args []string, out *outputs) error {
	var f gatherFlags
	fs := newFlagSet("gather", "gather [flags]", out)
	f.layout.register(fs)
	f.out.register(fs, time.Second, "measure memcpy of the same bytes in turn with each operation, and report the ratio")
	fs.StringVar(&f.prompts, "prompts", "1k,4k,16k", "prompt lengths in tokens, comma-separated")
	fs.StringVar(&f.slotSize, "slot-size", "4MiB", "bytes gathered or scattered per call: one staging slot, as the engine moves them")
	fs.StringVar(&f.memory, "memory", "host", "where the pool lives: host or device")
	fs.StringVar(&f.device, "device", "auto", deviceUsage)
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the random order of each request's blocks in the pool")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("gather takes no arguments, got %q", fs.Args())
	}
	cfg, err := f.resolve()
	if err != nil {
		return err
	}
	var note string
	if cfg.DeviceMemory {
		if cfg.Ordinal, cfg.GPU, note, err = chooseDevice(f.device); err != nil {
			return err
		}
	}
	if err := bench.CheckDeviceGather(cfg); err != nil { // --memory device: a GPU, or one line
		return err
	}
	printNote(out, note)
	return bench.Gather(ctx, cfg, out)
}

func (f *gatherFlags) resolve() (bench.GatherConfig, error) {
	if err := f.out.check(); err != nil {
		return bench.GatherConfig{}, err
	}
	var device bool
	switch f.memory {
	case "host":
	case "device":
		device = true
	default:
		return bench.GatherConfig{}, usagef("--memory %q: choose host or device", f.memory)
	}
	s, err := f.layout.shape()
	if err != nil {
		return bench.GatherConfig{}, err
	}
	prompts, err := parseTokens("prompts", f.prompts)
	if err != nil {
		return bench.GatherConfig{}, err
	}
	slot, err := parseBytes("slot-size", f.slotSize)
	if err != nil {
		return bench.GatherConfig{}, err
	}
	if slot < s.Dims.ElemSize {
		return bench.GatherConfig{}, usagef("--slot-size = %d: must hold at least one %d-byte element", slot, s.Dims.ElemSize)
	}
	pool, err := f.layout.layout(s, bench.MostBlocks(s, prompts), bench.PoolBlocksFor(s, prompts))
	if err != nil {
		return bench.GatherConfig{}, err
	}
	return bench.GatherConfig{Shape: s, Pool: pool, Prompts: prompts, Slot: slot, Out: f.out.Output, Seed: f.seed, DeviceMemory: device}, nil
}

// deviceUsage is --device's help, on every subcommand that takes --memory device.
const deviceUsage = "with --memory device: the GPU, auto (the one with the most free memory, as NVML reports it; device 0 without NVML) or a CUDA ordinal; the JSON results describe it in env.gpu"

// chooseDevice reads --device and resolves it with package bench (through NVML where the host
// has it); the note, if any, is for stderr once the device has opened.
func chooseDevice(flagValue string) (int, *bench.GPU, string, error) {
	device := bench.DeviceAuto
	if flagValue != "auto" {
		n, err := strconv.Atoi(flagValue)
		if err != nil || n < 0 {
			return 0, nil, "", usagef("--device %q: give auto or a device ordinal, 0 or more", flagValue)
		}
		device = n
	}
	return bench.ChooseDevice(device)
}

// printNote prints a note, if any, on stderr.
func printNote(out *outputs, note string) {
	if note != "" {
		fmt.Fprintln(out.Stderr, note)
	}
}
