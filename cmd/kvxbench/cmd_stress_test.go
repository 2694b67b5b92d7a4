// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// The stress subcommand is wired: a short fault-free soak passes and prints its JSON report;
// bad flags are usage errors; help lists its flags.
func TestStressSubcommand(t *testing.T) {
	cases := []struct {
		desc string
		args []string
		code int
		out  string
	}{
		{"a short fault-free soak", []string{"stress", "--duration", "2s", "--faults", "none", "--concurrency", "8", "--json"}, exitOK, `"passed": true`},
		{"a bad flag", []string{"stress", "--bogus"}, exitUsage, ""},
		{"an unknown fault", []string{"stress", "--faults", "meteor"}, exitUsage, ""},
		{"help", []string{"help", "stress"}, exitOK, "-processes"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Main(context.Background(), c.args, &stdout, &stderr)
			require.Equal(t, c.code, code, "stderr: %s", stderr.String())
			require.Contains(t, stdout.String(), c.out)
			if c.code == exitOK && c.args[0] == "stress" {
				var rep map[string]any
				require.NoError(t, json.Unmarshal(stdout.Bytes(), &rep))
				require.Equal(t, true, rep["passed"])
			}
		})
	}
}
