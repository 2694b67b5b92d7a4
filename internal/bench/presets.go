// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"errors"
	"strings"

	"github.com/kvxfer/kvxfer/layout"
)

// Preset is a named model shape: the per-rank KV pool a serving engine would allocate for it.
type Preset struct {
	Name    string
	Aliases []string
	Summary string
	Dims    layout.Dims // NumBlocks is sized from the prompts at run time
	Order   layout.Order
}

// Presets are the models kvxbench knows by name. Their shapes are the per-rank KV pool: a
// TP=8 rank of Llama-3-70B holds one of its eight KV heads.
var Presets = []Preset{
	{
		Name:    "llama3-8b",
		Summary: "Llama-3-8B: 32 layers, K and V, 8 KV heads, head dim 128, BF16, 32 tokens/block (128 KiB/token)",
		Dims:    layout.Dims{NumLayers: 32, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 32},
	},
	{
		Name:    "llama3-70b-tp8",
		Aliases: []string{"llama3-70b"},
		Summary: "Llama-3-70B, one TP=8 rank: 80 layers, K and V, 1 KV head (8/8), head dim 128, BF16, 32 tokens/block (40 KiB/token)",
		Dims:    layout.Dims{NumLayers: 80, KVFactor: 2, NumHeads: 1, HeadDim: 128, ElemSize: 2, TokensPerBlock: 32},
	},
	{
		Name:    "deepseek-v3",
		Aliases: []string{"deepseek-v3-mla"},
		Summary: "DeepSeek-V3 MLA: 61 layers, one joint latent (kv factor 1), 1 head, dim 576 (512+64 rope), BF16, 64 tokens/block (~69 KiB/token)",
		Dims:    layout.Dims{NumLayers: 61, KVFactor: 1, NumHeads: 1, HeadDim: 576, ElemSize: 2, TokensPerBlock: 64},
	},
}

// FindPreset finds a preset by its name or an alias; an unknown name is a usage error that
// lists the names.
func FindPreset(name string) (Preset, error) {
	var names []string
	for _, p := range Presets {
		if p.Name == name {
			return p, nil
		}
		for _, a := range p.Aliases {
			if a == name {
				return p, nil
			}
		}
		names = append(names, p.Name)
	}
	return Preset{}, Usagef("unknown model preset %q: choose one of %s, or describe a layout with --layers, --kv-factor, --heads, --head-dim, --dtype and --tokens-per-block",
		name, strings.Join(names, ", "))
}

// Shape is a resolved pool shape: its name for the table and its dimensions without a block
// count.
type Shape struct {
	Name  string
	Dims  layout.Dims
	Order layout.Order
}

// flagOfField names the flag that sets each layout field, so an impossible layout is reported
// in the user's terms.
var flagOfField = map[string]string{
	"NumLayers": "--layers", "KVFactor": "--kv-factor", "NumHeads": "--heads",
	"HeadDim": "--head-dim", "ElemSize": "--dtype", "TokensPerBlock": "--tokens-per-block",
	"NumBlocks": "--pool-blocks",
}

// LayoutUsageError reports an impossible layout as a usage error naming the flag that set the
// offending field.
func LayoutUsageError(err error) error {
	var fe *layout.FieldError
	if errors.As(err, &fe) {
		if fl, ok := flagOfField[fe.Field]; ok {
			return Usagef("impossible layout: %s = %d: %s", fl, fe.Value, fe.Reason)
		}
	}
	return Usagef("impossible layout: %v", err)
}
