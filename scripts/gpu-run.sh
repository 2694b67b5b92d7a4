#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gpu-run.sh [ARCHIVE]: the GPU checks and figures of `make gpu-test` (scripts/gpu-test.sh,
# scripts/gpu-test-ucx.sh), run from the prebuilt binaries of `make gpu-bundle`
# (scripts/gpu-bundle.sh; ARCHIVE defaults to build/gpu-bundle.tar.xz), on a GPU machine with a
# driver but no Go, no UCX, no compiler needed and no network. Run it from the repository root
# (the test binaries run in their package directories, for testdata). Everything it writes goes
# under $OUT (default ./gpu-out): one log per step, and summary.txt with every step's outcome
# and every figure line.
#
#   1. unpack the archive into a temporary directory
#   2. preflight, no GPU needed: the bundle's UCX (ucx_info, ucx_perftest over host memory),
#      every test binary lists its tests, libkvxcuda.so and libcudart load through the Go
#      loader (cuda/'s no-device test), the prebuilt peers run a two-process test, kvxbench
#      prints its help and runs a short host-memory run (it re-executes itself for its peer)
#   3. the GPU check: without an NVIDIA GPU, one line "gpu-run: no NVIDIA GPU ..." and exit 3
#   4. with a GPU: the kernel tests, BenchmarkGPU_Llama3_8B (gather/scatter beside cudaMemcpy
#      device-to-device), the device transfer tests of native/, transfer/ and
#      transfer/transport/ucx/, the cross-path promises on the device routes (DeviceOverUCX:
#      Close, Cancel and a killed peer mid-transfer), ucx_perftest -t ucp_get -m cuda,cuda, one short kvxbench run
#      with UCX_PROTO_INFO=y (which transports carry device memory: cuda_ipc or cuda_copy),
#      `kvxbench run --memory device` (registered pools as Spec.Device: the rma route a serving
#      process takes; each row's path says which route ran) and one 4k row of the same run with
#      --staging (device slots and kernels), for comparison
#
# Every step is bounded by `timeout`; a failing step does not stop the others (GPU time is
# scarce: one run should show everything). The step timeouts add up to at most 9 minutes, which
# the script checks before it starts. Exit: 0 all passed, 3 no GPU (after a clean preflight),
# 1 any step failed, 2 usage.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
[ $# -le 1 ] || { echo "usage: gpu-run.sh [ARCHIVE]" >&2; exit 2; }
archive=${1:-build/gpu-bundle.tar.xz}
[ -f "$archive" ] || { echo "gpu-run: no archive $archive (make gpu-bundle builds it)" >&2; exit 2; }
OUT=${OUT:-$repo/gpu-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
summary=$OUT/summary.txt
: >"$summary"

# Each step's timeout in seconds, in one table so that their sum, with the grace each step's
# kill may take, is checked against the 8-minute budget before anything runs.
declare -A limit=(
	[unpack]=15
	[pre-ucx-info]=5 [pre-perftest-host]=15 [pre-list]=10 [pre-cuda-load]=15 [pre-peers]=30
	[pre-kvxbench]=12
	[gpu-smi]=5 [gpu-cuda-tests]=35 [gpu-cuda-bench]=30 [gpu-native-device]=20
	[gpu-transfer-device]=45 [gpu-transfer-promises]=120 [gpu-ucx-device]=20 [gpu-ucx-transports]=5 [gpu-perftest-cuda]=20
	[gpu-devices]=10 [gpu-proto-info]=12 [gpu-run-device]=30 [gpu-run-device-staging]=10
	[gpu-rma-norace]=25
)
budget=540 grace=2
total=0
for s in "${!limit[@]}"; do total=$((total + limit[$s] + grace)); done
[ "$total" -le "$budget" ] || { echo "gpu-run: the step timeouts add up to $total s, over the $budget s budget" >&2; exit 2; }

note() { echo "gpu-run: $*" | tee -a "$summary"; }
# figures LOG PATTERN: copy the figure lines of LOG into the summary, indented.
figures() { grep -E "$2" "$1" 2>/dev/null | sed 's/^/    /' | tee -a "$summary"; }

# device_rows JSON: one summary line per scenario of a kvxbench --json run, with its path.
device_rows() {
python3 - "$1" <<'EOF' 2>&1 | tee -a "$summary"
import json, sys
text = open(sys.argv[1]).read()
try:
    doc = json.loads(text)
    results = doc if isinstance(doc, list) else doc.get("results", [doc])
except ValueError:
    results = [json.loads(l) for l in text.splitlines() if l.strip().startswith("{")]
for r in results:
    print("    %-28s %6s tokens  %8.2f GB/s  p50 %8.1f us  p99 %8.1f us  baseline %s GB/s  ratio %s  verified %s  path %s" % (
        r.get("name"), r.get("tokens"), r.get("gbps", 0), r.get("p50_us", 0), r.get("p99_us", 0),
        r.get("baseline_gbps"), r.get("ratio"), r.get("verified"), r.get("path")))
EOF
}

failed=()
# step NAME CMD...: run CMD bounded by limit[NAME] (then killed), its output in $OUT/NAME.log.
step() {
	local name=$1 t0=$SECONDS rc=0 how
	shift
	# Through bash, so that the exported functions below (perftest, pkgtest) can be steps.
	timeout -k "$grace" "${limit[$name]}" bash -c '"$@"' step "$@" >"$OUT/$name.log" 2>&1 || rc=$?
	case $rc in
	0) how=ok ;;
	124 | 137) how="TIMEOUT after ${limit[$name]} s" ;;
	*) how="FAILED (exit $rc)" ;;
	esac
	[ "$rc" = 0 ] || failed+=("$name")
	note "$(printf '%-20s %-22s %3d s  %s' "$name" "$how" $((SECONDS - t0)) "$OUT/$name.log")"
	return "$rc"
}

note "$(date -u +%Y-%m-%dT%H:%M:%SZ) $archive ($(stat -c %s "$archive") bytes) on $(uname -n); step timeouts add up to $total s"
work=$(mktemp -d "${TMPDIR:-/tmp}/kvxfer-gpu.XXXXXX")
# The device tool brings back only a few files from $OUT: every step's log goes back in one
# archive, $OUT/logs.tar.gz, beside summary.txt and the JSON of the device runs.
pack_logs() {
	(cd "$OUT" && ls ./*.log >/dev/null 2>&1 && tar czf logs.tar.gz ./*.log && rm -f ./*.log) || true
}
trap 'rm -rf "$work"; pack_logs' EXIT
# GNU tar with xz where there is one, else python3's tarfile: a bare GPU host has one of them.
if command -v xz >/dev/null 2>&1; then
	step unpack tar -C "$work" -xJf "$archive"
else
	step unpack python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$archive" "$work"
fi
b=$work/kvxfer-gpu
[ -x "$b/bin/kvxbench" ] || { note "the archive holds no kvxfer-gpu/bin/kvxbench"; exit 1; }
sed -n 2,4p "$b/MANIFEST" | sed 's/^/    /' | tee -a "$summary"

ucx=$b/ucx/libucx
export PATH="$ucx/bin:$PATH" LD_LIBRARY_PATH="$ucx/lib:$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KVX_CUDA_LIB=$b/lib/libkvxcuda.so KVX_CUDART=$b/lib/libcudart.so.13 KVX_REQUIRE_CUDA_LIBS=1
export KVX_UCXPEER_BIN=$b/bin/ucxpeer KVX_ENGINEPEER_BIN=$b/bin/enginepeer
export KVX_EXPECT_UCX_VERSION=1.22

# perftest MEMORY ARGS...: one ucx_perftest ucp_get client against a server on loopback, both
# from the bundle; the server needs a moment to listen, so the client retries, bounded.
perftest() {
	local port=$((20000 + RANDOM % 10000)) server rc=1 try
	ucx_perftest -p "$port" &
	server=$!
	for try in $(seq 1 20); do
		if ucx_perftest 127.0.0.1 -p "$port" "$@"; then rc=0; break; fi
		kill -0 "$server" 2>/dev/null || break
		sleep 0.5
	done
	kill "$server" 2>/dev/null
	wait "$server" 2>/dev/null
	return "$rc"
}
export -f perftest

# pkgtest PKGDIR BINARY ARGS...: a test binary in its package directory, UCX's mpool warnings
# at exit dropped.
pkgtest() {
	local dir=$1 bin=$2
	shift 2
	(set -o pipefail && cd "$dir" && "$bin" "$@" 2>&1 | { grep -v 'was not returned to mpool' || true; })
}
export -f pkgtest

# --- preflight: no GPU needed ---
note "preflight (no GPU needed)"
step pre-ucx-info ucx_info -v && figures "$OUT/pre-ucx-info.log" 'version'
grep -F "Library version: $KVX_EXPECT_UCX_VERSION" "$OUT/pre-ucx-info.log" >/dev/null ||
	{ note "pre-ucx-info: the bundle's ucx_info does not report UCX $KVX_EXPECT_UCX_VERSION"; failed+=(pre-ucx-version); }
step pre-perftest-host perftest -t ucp_get -m host,host -s 2097152 -n 200 -w 20 &&
	figures "$OUT/pre-perftest-host.log" 'Final'
step pre-list bash -c "set -e
	pkgtest cuda '$b/bin/cuda.test' -test.list .
	pkgtest cuda '$b/bin/cuda-bench.test' -test.list .
	pkgtest native '$b/bin/native.test' -test.list .
	pkgtest transfer '$b/bin/transfer.test' -test.list .
	pkgtest transfer '$b/bin/transfer-norace.test' -test.list .
	pkgtest transfer/transport/ucx '$b/bin/ucx.test' -test.list ."
for t in BenchmarkGPU_Llama3_8B TestUCXDevice_ TestUCXRegion_Device; do
	grep "^$t" "$OUT/pre-list.log" >/dev/null || { note "pre-list: no $t in the test binaries"; failed+=(pre-list-$t); }
done
# The Go loader opens libcudart and libkvxcuda.so and checks the ABI; without a device it must
# say "no device" (on a GPU host that test skips and the ABI test still runs).
step pre-cuda-load pkgtest cuda "$b/bin/cuda.test" -test.count=1 -test.v \
	-test.run '^(TestOpen_NoGPUIsErrNoDevice|TestABI_StructsMatchLibrary|TestABI_MirrorsCoverEveryFieldWithoutPadding)$'
# One two-process test per peer: the prebuilt ucxpeer and enginepeer, no go build.
step pre-peers bash -c "set -e
	pkgtest native '$b/bin/native.test' -test.count=1 -test.v -test.run '^TestUCX_TwoProcessesEveryByteChecked$'
	pkgtest transfer '$b/bin/transfer.test' -test.count=1 -test.v -test.run '^TestUCXTransport_TwoProcessesEveryByteChecked$'"
step pre-kvxbench bash -c "set -e
	'$b/bin/kvxbench' --help
	'$b/bin/kvxbench' run --prompts 1k --concurrency 1 --duration 200ms --baseline=false"
figures "$OUT/pre-kvxbench.log" '^(scenario|transfer) '
for l in pre-cuda-load pre-peers; do
	grep -E '^--- (PASS|SKIP)' "$OUT/$l.log" | sed 's/^/    /' | tee -a "$summary" >/dev/null
done
preflight_failed=${#failed[@]}

# --- the GPU check ---
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep '^GPU ' >/dev/null; then
	if [ "$preflight_failed" != 0 ]; then
		note "FAILED: preflight steps ${failed[*]} (and no NVIDIA GPU on this host); see $OUT"
		exit 1
	fi
	note "no NVIDIA GPU on this host (nvidia-smi missing or lists no GPU); the preflight passed, so the bundle loads: run this on a GPU machine"
	exit 3
fi

# --- with a GPU ---
export KVX_EXPECT_UCX_CUDA=1
step gpu-smi nvidia-smi -L && figures "$OUT/gpu-smi.log" '^GPU '
step gpu-cuda-tests pkgtest cuda "$b/bin/cuda.test" -test.count=1 -test.v -test.timeout 45s
figures "$OUT/gpu-cuda-tests.log" '^--- FAIL|^(ok|FAIL|PASS)$'
note "gather/scatter beside cudaMemcpy device-to-device (BenchmarkGPU_Llama3_8B):"
step gpu-cuda-bench pkgtest cuda "$b/bin/cuda-bench.test" -test.count=1 -test.run '^$' \
	-test.bench 'BenchmarkGPU_Llama3_8B' -test.benchtime 20x -test.timeout 40s
figures "$OUT/gpu-cuda-bench.log" '^Benchmark|^cpu:'
device_tests='MemoryType|DeviceMemory|UCXDevice|UCXRegion_Device'
step gpu-native-device pkgtest native "$b/bin/native.test" -test.count=1 -test.v -test.timeout 18s -test.run "$device_tests"
step gpu-transfer-device pkgtest transfer "$b/bin/transfer.test" -test.count=1 -test.v -test.timeout 40s -test.run "$device_tests"
# The cross-path promises on the device routes (transfer/ucx_device_*_gpu_test.go): Close
# mid-transfer (L1), Cancel's outcome (L10, L3), a peer killed mid-transfer (L9) or before any
# byte (L11), a frozen peer (L12).
step gpu-transfer-promises pkgtest transfer "$b/bin/transfer.test" -test.count=1 -test.v -test.timeout 115s -test.run 'DeviceOverUCX'
# The two-process device rma test again from a build without -race: on 2026-11-29 the race
# build's process read the peer's pool at 0.5-0.6 GB/s and the peer read its at about 50
# (docs/gpu-results.md); this says whether the instrumentation is why.
step gpu-rma-norace pkgtest transfer "$b/bin/transfer-norace.test" -test.count=1 -test.v -test.timeout 22s \
	-test.run '^TestUCXRegion_DeviceTwoProcessesGPUToGPU$'
step gpu-ucx-device pkgtest transfer/transport/ucx "$b/bin/ucx.test" -test.count=1 -test.v -test.timeout 18s -test.run "$device_tests"
for l in gpu-native-device gpu-transfer-device gpu-transfer-promises gpu-rma-norace gpu-ucx-device; do
	figures "$OUT/$l.log" 'device-rma|^--- (PASS|FAIL|SKIP)|^(ok|FAIL|PASS)$'
done
step gpu-ucx-transports bash -c "ucx_info -d | grep -E 'Transport: (cuda|posix|cma|tcp)' | sort | uniq -c" &&
	figures "$OUT/gpu-ucx-transports.log" 'Transport'
note "ucx_perftest ucp_get, cuda memory on both sides, 2 MiB messages (one Llama-3-8B KV block):"
# With cuda_ipc gets on, as kvxfer's contexts ask for them (UCX 1.22 turns them off without
# NVLink: 0.8 against 169 GB/s on an H200, docs/gpu-results.md).
step gpu-perftest-cuda env UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y bash -c 'perftest "$@"' perftest -t ucp_get -m cuda,cuda -s 2097152 -n 2000 -w 100
figures "$OUT/gpu-perftest-cuda.log" 'Final|MB/s'
step gpu-devices "$b/bin/kvxbench" devices && figures "$OUT/gpu-devices.log" '.'
note "which UCX protocols carry device memory (UCX_PROTO_INFO=y, one short run):"
step gpu-proto-info env UCX_PROTO_INFO=y "$b/bin/kvxbench" run --memory device --prompts 1k \
	--concurrency 1 --duration 100ms --baseline=false
grep -iE 'cuda|rendezvous|eager' "$OUT/gpu-proto-info.log" | sort -u | sed -n 1,20p | sed 's/^/    /' | tee -a "$summary"
# UCX 1.22 prints its tables for tagged messages and memory-type copies, not for the rma route's
# gets (2026-11-29, H200: "cuda_copy" only, while the rma rows moved 258 GB/s, which only
# cuda_ipc does): the rma rows' GB/s say what carried their gets.
if grep cuda_ipc "$OUT/gpu-proto-info.log" >/dev/null; then
	note "device memory carried by cuda_ipc"
elif grep cuda_copy "$OUT/gpu-proto-info.log" >/dev/null; then
	note "UCX_PROTO_INFO named cuda_copy, not cuda_ipc (tagged messages and copies; its tables leave the rma gets out: see the rma rows' GB/s)"
else
	note "UCX_PROTO_INFO named neither cuda_ipc nor cuda_copy (see $OUT/gpu-proto-info.log)"
fi
note "kvxbench run --memory device --prompts 1k,4k,16k --concurrency 1 --json (registered pools, Spec.Device: path rma expected; JSON in $OUT/device-run.json):"
step gpu-run-device bash -c "'$b/bin/kvxbench' run --memory device --prompts 1k,4k,16k --concurrency 1 --json >'$OUT/device-run.json'"
device_rows "$OUT/device-run.json"
note "the same pools on the staging route, for comparison (--staging; JSON in $OUT/device-run-staging.json):"
step gpu-run-device-staging bash -c "'$b/bin/kvxbench' run --memory device --staging --prompts 4k --concurrency 1 --duration 1s \
	--baseline=false --json >'$OUT/device-run-staging.json'"
device_rows "$OUT/device-run-staging.json"

if [ ${#failed[@]} != 0 ]; then
	note "FAILED: ${failed[*]} (every step ran; logs in $OUT)"
	exit 1
fi
note "OK: every step passed; figures above and in $OUT"
