#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gpu-test-ucx.sh BUILDDIR PROMPTS [RUNFLAGS]: the device transfer over UCX, `make gpu-test-ucx`
# (mk/cuda.mk), on the libkvxcuda.so that gpu-test built in BUILDDIR. native/, transfer/ and
# kvxbench are built against the CUDA-enabled UCX of the libucx-cu12 wheel
# (scripts/ucx-cuda-env.sh); the device transfer tests run (registered cudaMalloc memory moved by
# gets GPU to GPU, in one process and two, reported beside `ucx_perftest -t ucp_get -m cuda`), then `kvxbench run --memory device`:
# two processes on this GPU, pools and staging slots in device memory, PROMPTS through the
# engine, every byte checked, beside `ucx_perftest -m cuda`. A failing test does not stop the
# run (GPU time is scarce: one session should show both); the script still fails at the end.
# RUNFLAGS is one string of extra kvxbench flags, split on spaces. GO names the go command.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
[ $# -ge 2 ] && [ $# -le 3 ] || { echo "usage: gpu-test-ucx.sh BUILDDIR PROMPTS [RUNFLAGS]" >&2; exit 2; }
build=$1 prompts=$2 run_flags=${3:-}
[ -f "$build/libkvxcuda.so" ] || { echo "gpu-test-ucx: no $build/libkvxcuda.so; run make gpu-test" >&2; exit 1; }
build=$(cd "$build" && pwd)

. scripts/ucx-cuda-env.sh
cuda=$(scripts/cuda-toolchain.sh)
cudart=$(ls "$cuda"/lib64/libcudart.so.[0-9]* "$cuda"/lib/libcudart.so.[0-9]* 2>/dev/null | sort | sed -n 1p)
export KVX_CUDA_LIB=$build/libkvxcuda.so KVX_CUDART="$cudart" KVX_EXPECT_UCX_CUDA=1 KVX_EXPECT_UCX_VERSION=1.22
echo "gpu-test-ucx: UCX $(pkg-config --modversion ucx) from $root; ucx_info sees:"
ucx_info -d | grep -E 'Transport: (cuda|posix|cma|tcp)' | sort | uniq -c || true

rc=0
"$GO" test -tags gpu -race -count=1 -timeout 10m -v -run 'MemoryType|DeviceMemory|UCXDevice|UCXRegion_Device|DeviceOverUCX' ./native/ ./transfer/ ./transfer/transport/ucx/ || rc=1
echo "gpu-test-ucx: registered cudaMalloc memory moved by gets GPU to GPU, two processes (the 'device-rma two-process' lines above),"
echo "gpu-test-ucx: beside ucx_perftest ucp_get, cuda memory on both sides, 2 MiB messages (one Llama-3-8B KV block), $build/perftest-cuda-get.log:"
port=$((20000 + RANDOM % 10000))
ucx_perftest -p "$port" >"$build/perftest-cuda-server.log" 2>&1 &
server=$!
for try in 1 2 3 4 5 6 7 8 9 10; do # the server needs a moment to listen; each try is bounded
	if timeout 120 ucx_perftest 127.0.0.1 -p "$port" -t ucp_get -m cuda,cuda -s 2097152 -n 2000 -w 100 >"$build/perftest-cuda-get.log" 2>&1; then
		tail -n 3 "$build/perftest-cuda-get.log"
		break
	fi
	[ "$try" = 10 ] && { echo "gpu-test-ucx: ucx_perftest -m cuda failed; see $build/perftest-cuda-get.log"; rc=1; }
	sleep 0.5
done
kill "$server" 2>/dev/null || true
wait "$server" 2>/dev/null || true
"$GO" build -o "$build/kvxbench" ./cmd/kvxbench
echo "gpu-test-ucx: the GPUs as NVML reports them (kvxbench devices; the runs below take --device auto):"
"$build/kvxbench" devices || rc=1
echo "gpu-test-ucx: which UCX protocols carry device memory (UCX_PROTO_INFO=y, one short run, $build/device-proto.log):"
UCX_PROTO_INFO=y "$build/kvxbench" run --memory device --prompts 1k --concurrency 1 --duration 100ms --baseline=false \
	>"$build/device-proto.log" 2>&1 || echo "gpu-test-ucx: the short run failed; see $build/device-proto.log"
grep -iE 'cuda|rendezvous|eager' "$build/device-proto.log" | sort | uniq | head -n 40 || true
echo "gpu-test-ucx: $build/kvxbench run --memory device --prompts $prompts --concurrency 1 --json $run_flags"
# shellcheck disable=SC2086 # run_flags is a list of flags
"$build/kvxbench" run --memory device --prompts "$prompts" --concurrency 1 --json $run_flags | tee "$build/device-run.json" || rc=1
echo "gpu-test-ucx: the same pools on the staging route, for comparison (--staging: device slots and kernels)"
# shellcheck disable=SC2086 # run_flags is a list of flags
"$build/kvxbench" run --memory device --staging --prompts "$prompts" --concurrency 1 --baseline=false --json $run_flags |
	tee "$build/device-run-staging.json" || rc=1
echo "gpu-test-ucx: figures in $build/device-run.json (path rma: registered pools, Spec.Device) and $build/device-run-staging.json (record them in docs/gpu-results.md)"
[ "$rc" = 0 ] || { echo "gpu-test-ucx: FAILED (see above: the device tests and the run both ran, so one GPU session shows both)"; exit 1; }
