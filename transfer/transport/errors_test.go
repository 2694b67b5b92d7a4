// SPDX-License-Identifier: Apache-2.0

package transport

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTypedErrorsMatchTheirSentinels(t *testing.T) {
	cause := errors.New("pool undersized")
	cases := []struct {
		desc  string
		err   error
		match []error
		not   []error
	}{
		{"a control message over the room", &ControlSizeError{Bytes: 9, Room: 8}, []error{ErrControlTooLarge}, []error{ErrInvalidSpec, ErrInvalidConfig}},
		{"a config field", &ConfigError{Field: "F", Value: 1, Reason: "r"}, []error{ErrInvalidConfig}, []error{ErrInvalidSpec}},
		{"a config field with a cause", &ConfigError{Field: "F", Value: 1, Reason: "r", Cause: cause}, []error{ErrInvalidConfig, cause}, nil},
		{"a region in use", &RegionError{Op: "unregister", Err: ErrRegionInUse}, []error{ErrRegionInUse}, []error{ErrBadRegion}},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			for _, m := range c.match {
				require.ErrorIs(t, c.err, m)
			}
			for _, m := range c.not {
				require.NotErrorIs(t, c.err, m)
			}
			require.NotEmpty(t, c.err.Error())
		})
	}
}

// A ConfigError names the field, and its value when there is one.
func TestConfigErrorLeavesOutAMissingValue(t *testing.T) {
	require.Equal(t, "kvxfer: invalid configuration: Transport: a transport is required",
		(&ConfigError{Field: "Transport", Reason: "a transport is required"}).Error())
	require.Equal(t, "kvxfer: invalid configuration: Lanes = 99: at most 64",
		(&ConfigError{Field: "Lanes", Value: 99, Reason: "at most 64"}).Error())
}

func TestMemoryNamesEveryVerdict(t *testing.T) {
	seen := map[string]bool{}
	for _, m := range []Memory{MemoryDone, MemoryBusy, MemoryUnknown} {
		require.NotEqual(t, "memory(?)", m.String())
		require.False(t, seen[m.String()], "two verdicts named %q", m)
		seen[m.String()] = true
	}
	require.Equal(t, "memory(?)", Memory(-1).String())
}
