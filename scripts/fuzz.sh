#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# fuzz.sh GO PACKAGE TARGET FUZZTIME [MINIMIZETIME]: run one Go fuzz target for FUZZTIME,
# minimizing each new input for at most MINIMIZETIME (Go's -fuzzminimizetime; default Go's 60s).
# A target whose inputs run in a child process (FuzzRemoteKey) needs a bound there: minimizing
# one input reruns it, child and all, until that bound, whatever FUZZTIME says.
#
# Go 1.26's fuzzing coordinator can fail a run at the -fuzztime boundary with a bare
# "context deadline exceeded" when a worker is mid-input as the deadline fires (golang/go#75804,
# fixed in Go 1.27); CI saw it on FuzzPlan on a loaded 2-core host. Such a run found nothing: a
# real finding always writes its input under testdata/fuzz and says "Failing input written".
# So that one outcome, and only it, passes with a note; any other failure fails.
set -uo pipefail
go_bin=$1 pkg=$2 target=$3 fuzztime=$4 minimize=${5:-60s}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$go_bin" test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimize" "$pkg" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ] && grep -q 'context deadline exceeded' "$log" &&
	! grep -qiE 'failing input|panic:|\.go:[0-9]+:' "$log"; then
	echo "fuzz.sh: $target ran its $fuzztime and found nothing; the bare 'context deadline exceeded' at the boundary is Go's coordinator race (golang/go#75804), not a finding"
	exit 0
fi
exit "$rc"
