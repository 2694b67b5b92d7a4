// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"flag"
	"strings"

	"github.com/kvxfer/kvxfer/layout"
)

// preset is a named model shape: the per-rank KV pool a serving engine would allocate for it.
type preset struct {
	name    string
	aliases []string
	summary string
	dims    layout.Dims // NumBlocks is sized from the prompts at run time
	order   layout.Order
}

// presets are the models kvxbench knows by name. Their shapes are the per-rank KV pool: a
// TP=8 rank of Llama-3-70B holds one of its eight KV heads.
var presets = []preset{
	{
		name:    "llama3-8b",
		summary: "Llama-3-8B: 32 layers, K and V, 8 KV heads, head dim 128, BF16, 32 tokens/block (128 KiB/token)",
		dims:    layout.Dims{NumLayers: 32, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 32},
	},
	{
		name:    "llama3-70b-tp8",
		aliases: []string{"llama3-70b"},
		summary: "Llama-3-70B, one TP=8 rank: 80 layers, K and V, 1 KV head (8/8), head dim 128, BF16, 32 tokens/block (40 KiB/token)",
		dims:    layout.Dims{NumLayers: 80, KVFactor: 2, NumHeads: 1, HeadDim: 128, ElemSize: 2, TokensPerBlock: 32},
	},
	{
		name:    "deepseek-v3",
		aliases: []string{"deepseek-v3-mla"},
		summary: "DeepSeek-V3 MLA: 61 layers, one joint latent (kv factor 1), 1 head, dim 576 (512+64 rope), BF16, 64 tokens/block (~69 KiB/token)",
		dims:    layout.Dims{NumLayers: 61, KVFactor: 1, NumHeads: 1, HeadDim: 576, ElemSize: 2, TokensPerBlock: 64},
	},
}

func findPreset(name string) (preset, error) {
	var names []string
	for _, p := range presets {
		if p.name == name {
			return p, nil
		}
		for _, a := range p.aliases {
			if a == name {
				return p, nil
			}
		}
		names = append(names, p.name)
	}
	return preset{}, usagef("unknown model preset %q: choose one of %s, or describe a layout with --layers, --kv-factor, --heads, --head-dim, --dtype and --tokens-per-block",
		name, strings.Join(names, ", "))
}

// layoutFlags are the flags that pick a pool shape: a preset, then any field overridden.
type layoutFlags struct {
	model          string
	layers         int64
	kvFactor       int64
	heads          int64
	headDim        int64
	dtype          string
	tokensPerBlock int64
	order          string
	poolBlocks     int64
	fs             *flag.FlagSet
}

func (f *layoutFlags) register(fs *flagSet) {
	f.fs = fs.FlagSet
	fs.StringVar(&f.model, "model", "llama3-8b", "model preset (listed by kvxbench help); the flags below override its fields")
	fs.Int64Var(&f.layers, "layers", 0, "layers in the pool (default: the preset's)")
	fs.Int64Var(&f.kvFactor, "kv-factor", 0, "2 for separate K and V, 1 for MLA (default: the preset's)")
	fs.Int64Var(&f.heads, "heads", 0, "KV heads in this rank's pool (default: the preset's)")
	fs.Int64Var(&f.headDim, "head-dim", 0, "elements per head per token (default: the preset's)")
	fs.StringVar(&f.dtype, "dtype", "", "element type: fp8, bf16, fp16 or fp32 (default: the preset's)")
	fs.Int64Var(&f.tokensPerBlock, "tokens-per-block", 0, "tokens per paged block (default: the preset's)")
	fs.StringVar(&f.order, "order", "block-major", "pool order: block-major, layer-major or layer-major-nhd")
	fs.Int64Var(&f.poolBlocks, "pool-blocks", 0, "blocks in the pool (default: enough for the largest prompt and a quarter more, so a request's blocks are scattered)")
}

// shape is a resolved pool shape: its name for the table and its dimensions without a block
// count.
type shape struct {
	name  string
	dims  layout.Dims
	order layout.Order
}

func (f *layoutFlags) shape() (shape, error) {
	p, err := findPreset(f.model)
	if err != nil {
		return shape{}, err
	}
	s := shape{name: p.name, dims: p.dims, order: p.order}
	custom := false
	var bad error
	f.fs.Visit(func(fl *flag.Flag) {
		set := func(dst *int64, v int64) {
			custom = true
			if v <= 0 && bad == nil {
				bad = usagef("--%s = %d: must be positive", fl.Name, v)
			}
			*dst = v
		}
		switch fl.Name {
		case "layers":
			set(&s.dims.NumLayers, f.layers)
		case "kv-factor":
			set(&s.dims.KVFactor, f.kvFactor)
		case "heads":
			set(&s.dims.NumHeads, f.heads)
		case "head-dim":
			set(&s.dims.HeadDim, f.headDim)
		case "tokens-per-block":
			set(&s.dims.TokensPerBlock, f.tokensPerBlock)
		case "dtype":
			custom = true
			size, err := dtypeSize(f.dtype)
			if err != nil && bad == nil {
				bad = err
			}
			s.dims.ElemSize = size
		}
	})
	if bad != nil {
		return shape{}, bad
	}
	if s.order, err = parseOrder(f.order); err != nil {
		return shape{}, err
	}
	if custom {
		s.name = "custom(" + p.name + ")"
	}
	// Validate the shape once with one block, so an impossible layout is refused before any
	// memory is allocated, with the flag that set it named.
	probe := s.dims
	probe.NumBlocks = 1
	if err := layout.Packed(probe, s.order).Validate(); err != nil {
		return shape{}, layoutUsageError(err)
	}
	return s, nil
}

// layout returns the shape as a pool of --pool-blocks blocks when set (at least need), else
// of numBlocks.
func (f *layoutFlags) layout(s shape, need, numBlocks int64) (layout.Layout, error) {
	if f.poolBlocks != 0 {
		if f.poolBlocks < need {
			return layout.Layout{}, usagef("--pool-blocks = %d: the run needs at least %d blocks", f.poolBlocks, need)
		}
		numBlocks = f.poolBlocks
	}
	d := s.dims
	d.NumBlocks = numBlocks
	l := layout.Packed(d, s.order)
	if err := l.Validate(); err != nil {
		return layout.Layout{}, layoutUsageError(err)
	}
	return l, nil
}

// flagOfField names the flag that sets each layout field, so an impossible layout is reported
// in the user's terms.
var flagOfField = map[string]string{
	"NumLayers": "--layers", "KVFactor": "--kv-factor", "NumHeads": "--heads",
	"HeadDim": "--head-dim", "ElemSize": "--dtype", "TokensPerBlock": "--tokens-per-block",
	"NumBlocks": "--pool-blocks",
}

func layoutUsageError(err error) error {
	var fe *layout.FieldError
	if errors.As(err, &fe) {
		if fl, ok := flagOfField[fe.Field]; ok {
			return usagef("impossible layout: %s = %d: %s", fl, fe.Value, fe.Reason)
		}
	}
	return usagef("impossible layout: %v", err)
}

func dtypeSize(name string) (int64, error) {
	switch strings.ToLower(name) {
	case "fp8", "e4m3", "e5m2", "int8":
		return 1, nil
	case "bf16", "fp16", "f16":
		return 2, nil
	case "fp32", "f32":
		return 4, nil
	}
	return 0, usagef("--dtype %q: choose fp8, bf16, fp16 or fp32", name)
}

func parseOrder(name string) (layout.Order, error) {
	for _, o := range []layout.Order{layout.BlockMajor, layout.LayerMajor, layout.LayerMajorNHD} {
		if o.String() == name {
			return o, nil
		}
	}
	return 0, usagef("--order %q: choose block-major, layer-major or layer-major-nhd", name)
}
