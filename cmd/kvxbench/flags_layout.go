// SPDX-License-Identifier: Apache-2.0

package main

import (
	"flag"
	"strings"

	"github.com/kvxfer/kvxfer/internal/bench"
	"github.com/kvxfer/kvxfer/layout"
)

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

// shape resolves the preset and the fields the flags override.
func (f *layoutFlags) shape() (bench.Shape, error) {
	p, err := bench.FindPreset(f.model)
	if err != nil {
		return bench.Shape{}, err
	}
	s := bench.Shape{Name: p.Name, Dims: p.Dims, Order: p.Order}
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
			set(&s.Dims.NumLayers, f.layers)
		case "kv-factor":
			set(&s.Dims.KVFactor, f.kvFactor)
		case "heads":
			set(&s.Dims.NumHeads, f.heads)
		case "head-dim":
			set(&s.Dims.HeadDim, f.headDim)
		case "tokens-per-block":
			set(&s.Dims.TokensPerBlock, f.tokensPerBlock)
		case "dtype":
			custom = true
			size, err := dtypeSize(f.dtype)
			if err != nil && bad == nil {
				bad = err
			}
			s.Dims.ElemSize = size
		}
	})
	if bad != nil {
		return bench.Shape{}, bad
	}
	if s.Order, err = parseOrder(f.order); err != nil {
		return bench.Shape{}, err
	}
	if custom {
		s.Name = "custom(" + p.Name + ")"
	}
	// Validate the shape once with one block, so an impossible layout is refused before any
	// memory is allocated, with the flag that set it named.
	probe := s.Dims
	probe.NumBlocks = 1
	if err := layout.Packed(probe, s.Order).Validate(); err != nil {
		return bench.Shape{}, bench.LayoutUsageError(err)
	}
	return s, nil
}

// layout returns the shape as a pool of --pool-blocks blocks when set (at least need), else
// of numBlocks.
func (f *layoutFlags) layout(s bench.Shape, need, numBlocks int64) (layout.Layout, error) {
	if f.poolBlocks != 0 {
		if f.poolBlocks < need {
			return layout.Layout{}, usagef("--pool-blocks = %d: the run needs at least %d blocks", f.poolBlocks, need)
		}
		numBlocks = f.poolBlocks
	}
	d := s.Dims
	d.NumBlocks = numBlocks
	l := layout.Packed(d, s.Order)
	if err := l.Validate(); err != nil {
		return layout.Layout{}, bench.LayoutUsageError(err)
	}
	return l, nil
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
