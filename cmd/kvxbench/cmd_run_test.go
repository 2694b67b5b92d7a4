// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// run --stream measures layer-wise streaming per prompt through internal/streambench and
// prints its figures under streambench's JSON names.
func TestRunStream(t *testing.T) {
	skipWithoutHostCopy(t)
	code, stdout, stderr := runMain(t, time.Minute, "run", "--stream", "--stream-transport", "mem", "--json",
		"--layers", "4", "--prompts", "64,128", "--stream-runs", "1", "--slot-size", "64KiB")
	require.Equal(t, exitOK, code, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 2)
	var r map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &r))
	require.Equal(t, "stream custom(llama3-8b) 64", r["name"])
	for _, f := range []string{"exposed_us", "plain_us", "exposed_ratio", "stream_us", "bytes"} {
		require.Contains(t, r, f)
	}
	require.Greater(t, r["plain_us"].(float64), 0.0)

	code, stdout, stderr = runMain(t, time.Minute, "run", "--stream", "--stream-transport", "mem",
		"--layers", "2", "--prompts", "64", "--stream-runs", "1", "--slot-size", "64KiB")
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "exposed ratio")

	code, _, stderr = runMain(t, 5*time.Second, "run", "--stream", "--layer-compute", "-1ms")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "--layer-compute = -1ms")
}
