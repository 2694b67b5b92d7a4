#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gpu-test.sh BUILDDIR BENCHTIME: the kernel half of the GPU CI job, `make gpu-test` (mk/cuda.mk),
# which then runs the device transfer (scripts/gpu-test-ucx.sh). It refuses to run (non-zero,
# one clear line) on a host without an NVIDIA GPU, builds libkvxcuda.so into BUILDDIR with the
# system's nvcc for this GPU (else the PyPI one of scripts/cuda-toolchain.sh), runs the
# gpu-tagged tests of cuda/, then the device bandwidth benchmark against cudaMemcpy
# device-to-device for BENCHTIME. GO names the go command (default: go).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
[ $# -eq 2 ] || { echo "usage: gpu-test.sh BUILDDIR BENCHTIME" >&2; exit 2; }
mkdir -p "$1"
build=$(cd "$1" && pwd) benchtime=$2

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep '^GPU ' >/dev/null; then
	echo "gpu-test: no NVIDIA GPU on this host (nvidia-smi missing or lists no GPU); run this job on a GPU runner" >&2
	exit 1
fi
nvidia-smi -L
root=$(scripts/cuda-toolchain.sh)
case "$root" in */.toolchain/*) echo "gpu-test: no system CUDA toolkit; building with the PyPI nvcc at $root" >&2 ;; esac
cmake -S cuda -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$root/bin/nvcc" \
	-DCUDAToolkit_ROOT="$root" -DCMAKE_CUDA_ARCHITECTURES=native >/dev/null
cmake --build "$build" -j

cudart=$(ls "$root"/lib64/libcudart.so.[0-9]* "$root"/lib/libcudart.so.[0-9]* 2>/dev/null | sort | sed -n 1p)
[ -n "$cudart" ] || { echo "gpu-test: no libcudart.so.N under $root" >&2; exit 1; }
export KVX_CUDA_LIB=$build/libkvxcuda.so KVX_CUDART="$cudart"
echo "gpu-test: KVX_CUDA_LIB=$KVX_CUDA_LIB KVX_CUDART=$KVX_CUDART"
"$GO" test -tags gpu -race -count=1 -timeout 10m -v ./cuda/...
"$GO" test -tags gpu -count=1 -timeout 10m -run '^$' -bench . -benchtime "$benchtime" ./cuda/
