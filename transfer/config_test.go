// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/buffer"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// TestConfigErrorIsOneType holds ErrInvalidConfig's promise: every configuration New refuses
// is a *ConfigError naming the field, whether the engine or the staging pool found the fault;
// the pool's own error stays reachable as the cause.
func TestConfigErrorIsOneType(t *testing.T) {
	for _, tc := range []struct {
		desc  string
		edit  func(*Config)
		field string
		cause error
	}{
		{"a pool below the concurrency", func(c *Config) { c.MaxConcurrent, c.Tuning.NumSlots = 8, 5 }, "Tuning.NumSlots", buffer.ErrUndersized},
		{"a tuning knob names its place in Config", func(c *Config) { c.Tuning.PipelineDepth = -1 }, "Tuning.PipelineDepth", nil},
		{"a negative tuning budget", func(c *Config) { c.Tuning.MaxRetries = -2 }, "Tuning.MaxRetries", nil},
		{"a negative slot size", func(c *Config) { c.SlotBytes = -1 }, "SlotBytes", nil},
		{"a short cluster key", func(c *Config) { c.ClusterKeys = [][]byte{clusterKey(1), clusterKey(2)[:16]} }, "ClusterKeys[1]", nil},
		{"a cluster key twice", func(c *Config) { c.ClusterKeys = [][]byte{clusterKey(1), clusterKey(1)} }, "ClusterKeys[1]", nil},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			cfg := fastConfig()
			tc.edit(&cfg)
			tr := mem.NewNetwork().Transport("x")
			defer func() { require.NoError(t, tr.Close(true)) }()
			_, err := New(tr, cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
			var ce *ConfigError
			require.True(t, errors.As(err, &ce), "%T is not a *transfer.ConfigError: %v", err, err)
			require.Equal(t, tc.field, ce.Field)
			if tc.cause != nil {
				require.ErrorIs(t, err, tc.cause)
			}
		})
	}
}

// closerOnly closes but keeps no transport contract: not a transport a package made.
type closerOnly struct{}

func (closerOnly) Close(bool) error { return nil }

// New takes a Transport that a transport package made; a value that only closes (it would
// satisfy Transport's one method) is refused with a ConfigError naming it, not driven.
func TestNew_RefusesAValueThatKeepsNoTransportContract(t *testing.T) {
	_, err := New(closerOnly{}, Config{})
	require.ErrorIs(t, err, ErrInvalidConfig)
	var ce *ConfigError
	require.True(t, errors.As(err, &ce))
	require.Equal(t, "Transport", ce.Field)
	_, err = New(nil, Config{})
	require.ErrorIs(t, err, ErrInvalidConfig)
	e, err := New(mem.NewNetwork().Transport("a"), Config{})
	require.NoError(t, err)
	require.NoError(t, e.Close())
}
