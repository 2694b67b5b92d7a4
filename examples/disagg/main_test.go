// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/discovery/discoverytest"
)

// patientStory are the flags the story tests add: "healthz: 200 ok" and "decode: health: ok"
// at the end of the story hold only if no engine saw the story stall for its progress deadline
// (-progress-deadline, 2s by default) between request 1 completing and request 2's abort or
// request 3's cancel, which a loaded host's stall of a few seconds breaks; and the run's own
// bound (-timeout) is the test's, not a shorter one.
var patientStory = []string{"-progress-deadline=1m", "-timeout=2m"}

// TestDisagg_RunsAndReportsEachRequest runs the example as a user would (go run
// ./examples/disagg -transport=mem) and checks what it prints about each request.
func TestDisagg_RunsAndReportsEachRequest(t *testing.T) {
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, run(ctx, append([]string{"-transport=mem", "-tokens=100"}, patientStory...), &stdout, &stderr), "stderr: %s", stderr.String())
	out := stdout.String()
	// 100 tokens = 7 blocks of 256 KiB.
	for _, want := range []string{
		`(?m)^control plane: http://127\.0\.0\.1:\d+ `,
		`(?m)^registry http://127\.0\.0\.1:\d+: prefill-0's control plane is http://127\.0\.0\.1:\d+$`,
		`(?m)^decode: request 1: ContextParams \(\d+ bytes\) from prefill-0: prefill blocks \[0 1 2 3 4 5 6\]$`,
		`(?m)^decode: request 1: completed, 1835008 bytes from prefill-0 into blocks \[0 1 2 3 4 5 6\] in `,
		`(?m)^decode: request 1: all 1835008 bytes verified; blocks ready for generation$`,
		`(?m)^prefill: request 1: completed \(1835008 of 1835008 bytes\); blocks \[0 1 2 3 4 5 6\] freed$`,
		`(?m)^prefill: request 2: abort: cancelled-before-advertise: blocks \[\d[ \d]*\] freed at once$`,
		`(?m)^decode: request 2: client went away before its KV moved; prefill's cancel said cancelled-before-advertise$`,
		`(?m)^decode: request 3: cancel: cancel-requested-in-flight: stop scheduling it; blocks \[\d[ \d]*\] wait for Quiesced$`,
		`(?m)^decode: request 3: quiesced \(cancelled\); blocks \[\d[ \d]*\] freed$`,
		`(?m)^healthz: 200 ok$`,
		`(?m)^metrics: prefill sent 1835008 bytes, decode received 1835008 bytes$`,
		`(?m)^KV blocks free: prefill 64 of 64, decode 64 of 64$`,
	} {
		require.Regexp(t, regexp.MustCompile(want), out)
	}
	require.NotContains(t, out, "never quiesced")
}

// TestL12_DisaggProbeFlipsWhileTheWireIsFrozen runs the example's -freeze mode: /healthz must
// answer 503 with the reason while a transfer cannot move, and 200 once it has moved. The
// freeze lasts ten deadlines: the example probes only while the wire is frozen, and with 800ms
// a stall of the loaded host's test process could leave no probe after both roles' deadlines.
func TestL12_DisaggProbeFlipsWhileTheWireIsFrozen(t *testing.T) {
	var stdout, stderr bytes.Buffer
	require.NoError(t, run(t.Context(), []string{"-transport=mem", "-tokens=32", "-freeze=2s", "-progress-deadline=200ms"}, &stdout, &stderr),
		"stderr: %s", stderr.String())
	out := stdout.String()
	for _, want := range []string{
		`(?m)^healthz while frozen: 503 prefill: no transfer progressed for \d+ms \(deadline 200ms\) while 1 are in flight; decode: no transfer progressed`,
		`(?m)^decode: request 4: all 524288 bytes verified; blocks ready for generation$`,
		`(?m)^healthz after the wire moved again: 200 ok$`,
		`(?m)^KV blocks free: prefill 64 of 64, decode 64 of 64$`,
	} {
		require.Regexp(t, regexp.MustCompile(want), out)
	}
}

// With -discovery=etcd://... the workers find each other through etcd instead of the
// embedded registry, and the story is the same.
func TestDisagg_ThroughEtcd(t *testing.T) {
	e := discoverytest.StartEtcd(t)
	var stdout, stderr bytes.Buffer
	require.NoError(t, run(t.Context(), []string{"-transport=mem", "-tokens=16", "-discovery=" + e.Target("disagg")}, &stdout, &stderr),
		"stderr: %s", stderr.String())
	out := stdout.String()
	require.Regexp(t, `(?m)^registry etcd://127\.0\.0\.1:\d+/disagg: prefill-0's control plane is http://127\.0\.0\.1:\d+$`, out)
	require.Regexp(t, `(?m)^decode: request 1: all \d+ bytes verified`, out)
}

func TestDisagg_VerboseLogsLifecycle(t *testing.T) {
	var stdout, stderr bytes.Buffer
	require.NoError(t, run(t.Context(), []string{"-transport=mem", "-v", "-tokens=16"}, &stdout, &stderr))
	logs := stderr.String()
	require.Contains(t, logs, "transfer accepted")
	require.Contains(t, logs, "transfer state")
	require.Contains(t, logs, `"request": 3`)
}

func TestDisagg_RefusesBadFlags(t *testing.T) {
	cases := []struct {
		desc string
		args []string
		want string
		// ucx: the case gets past the transport check only where the UCX transport is built.
		ucx bool
	}{
		{"unknown transport", []string{"-transport=tcp"}, "want ucx or mem", false},
		{"unknown role", []string{"-transport=mem", "-role=router"}, "want both, prefill or decode", false},
		{"one role per process over mem", []string{"-transport=mem", "-role=prefill"}, "needs -transport=ucx", false},
		{"no tokens", []string{"-transport=mem", "-tokens=0"}, "-tokens=0", false},
		{"more tokens than the pool holds", []string{"-transport=mem", "-tokens=100000"}, "-tokens=100000", false},
		{"unknown flag", []string{"-frobnicate"}, "frobnicate", false},
		{"freeze shorter than the progress deadline", []string{"-transport=mem", "-freeze=1s", "-progress-deadline=2s"}, "must exceed", false},
		{"decode role without the prefill's address", []string{"-role=decode"}, "give the address the prefill process printed", true},
		{"freeze over UCX", []string{"-freeze=3s"}, "only with -transport=mem", true},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			if c.ucx && newUCXFabric == nil {
				c.want = "built without cgo" // what every UCX run says in such a build
			}
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), c.args, &stdout, &stderr)
			require.Error(t, err)
			require.Contains(t, err.Error()+stderr.String(), c.want)
			require.Empty(t, stdout.String(), "nothing ran")
		})
	}
}
