// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCommandRefusesBadInput(t *testing.T) {
	cases := []struct {
		desc string
		args []string
		want string
	}{
		{"unknown flag", []string{"--bogus"}, "bogus"},
		{"unknown fault", []string{"--faults", "cancel,meteor"}, "meteor"},
		{"stray argument", []string{"extra"}, "no arguments"},
		{"impossible config", []string{"--cancel-fraction", "2"}, "CancelFraction"},
		{"unknown path", []string{"--paths", "staging,rdma"}, "rdma"},
		{"loss past half the packets", []string{"--loss", "90"}, "LossPercent"},
		{"a prefill process that is not there", []string{"--hung-peer-first", "-1"}, "HungPeerFirst"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := Command(context.Background(), c.args, &out, &errOut)
			var ue *UsageError
			require.True(t, errors.As(err, &ue), "got %v", err)
			require.Contains(t, err.Error(), c.want)
			require.Empty(t, out.String())
		})
	}
	var out, errOut bytes.Buffer
	require.ErrorIs(t, Command(context.Background(), []string{"-h"}, &out, &errOut), flag.ErrHelp)
	require.Contains(t, errOut.String(), "-duration")
}

// A fault-free run through the command prints a passing JSON report, every request checked.
func TestCommandJSONOfAFaultFreeRun(t *testing.T) {
	var out, errOut bytes.Buffer
	err := Command(context.Background(), []string{"--duration", "2s", "--concurrency", "16", "--faults", "none", "--json"}, &out, &errOut)
	require.NoError(t, err, errOut.String())
	var rep Report
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	require.True(t, rep.Passed)
	require.Empty(t, rep.Breaches)
	require.Positive(t, rep.Started)
	require.Equal(t, rep.Started, rep.Completed, "without faults every request completes")
	require.Zero(t, rep.Quarantined)
	require.Zero(t, rep.PoisonedSlots)
}
