#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gpu-rehearse.sh ARCHIVE OUTDIR: `make gpu-bundle-rehearse` (mk/cuda.mk). Runs
# scripts/gpu-run.sh on ARCHIVE here the way the GPU machine will: no go command on PATH, and,
# where this host allows it, in a network namespace of its own with only loopback up (the
# GPU machine reaches no network). On a host without a GPU it must stop at the GPU check, exit
# 3, after a preflight in which every step passed; on a GPU host it must pass (exit 0).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: gpu-rehearse.sh ARCHIVE OUTDIR" >&2; exit 2; }
archive=$1 out=$2
rm -rf "$out"
mkdir -p "$out"

# PATH without any directory that holds a go command: the bundle must need none.
nogo=$(printf '%s\n' "$PATH" | tr ':' '\n' | while read -r d; do [ -n "$d" ] && [ ! -x "$d/go" ] && echo "$d"; done | paste -sd:)
PATH=$nogo command -v go >/dev/null && { echo "gpu-rehearse: could not take go off PATH" >&2; exit 1; }

expect=3
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep '^GPU ' >/dev/null; then expect=0; fi
run=(env PATH="$nogo" OUT="$out" bash scripts/gpu-run.sh "$archive")
if unshare -n true 2>/dev/null; then
	echo "gpu-rehearse: in a network namespace with only loopback, go off PATH; expecting exit $expect"
	run=(unshare -n bash -c 'ip link set lo up && exec "$@"' rehearse "${run[@]}")
else
	echo "gpu-rehearse: no network namespace here (unshare -n refused); go off PATH; expecting exit $expect"
fi
rc=0
"${run[@]}" || rc=$?

summary=$out/summary.txt
steps=$(grep -c '^gpu-run: pre-' "$summary" || true)
bad=$(grep -E '^gpu-run: pre-' "$summary" | grep -vc ' ok ' || true)
[ "$rc" = "$expect" ] || { echo "gpu-rehearse: FAILED: gpu-run.sh exited $rc, expected $expect (see $out)"; exit 1; }
[ "$steps" -ge 6 ] && [ "$bad" = 0 ] ||
	{ echo "gpu-rehearse: FAILED: the preflight is incomplete ($steps steps, $bad not ok; see $summary)"; exit 1; }
echo "gpu-rehearse: OK: gpu-run.sh exited $rc after a complete preflight ($steps steps ok); $summary"
