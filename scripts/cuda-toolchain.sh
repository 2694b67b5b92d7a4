#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Prints the directory of a CUDA toolkit root (one holding bin/nvcc) on stdout.
#
# A system toolkit wins (CUDA_HOME, then nvcc on PATH, then /usr/local/cuda), because a GPU host
# should build with the compiler that matches its driver. Without one, a pinned CUDA 13 nvcc is
# installed from PyPI wheels into .toolchain/ (git-ignored) and reused on every later run, so a
# repeat `make test` costs a directory check, not a download.
#
# Why these wheels: nvidia-cuda-nvcc 13.x ships bin/nvcc (the -cu12 wheel ships only ptxas);
# nvcc also needs cicc (nvidia-nvvm), the crt headers (nvidia-cuda-crt), the runtime headers and
# libcudart (nvidia-cuda-runtime) and libcu++ (nvidia-cuda-cccl). All five unpack into one
# nvidia/cu13 tree laid out like a toolkit. The versions are pinned to one release so a new
# upload to PyPI cannot change what `make test` compiles with.
#
# Usage: scripts/cuda-toolchain.sh [--wheel]   (--wheel skips the system toolkit search)
# Logs go to stderr; only the toolkit root goes to stdout.
set -euo pipefail

CUDA_WHEEL_VERSION=13.2.86
packages=(
  "nvidia-cuda-nvcc==${CUDA_WHEEL_VERSION}"
  "nvidia-cuda-crt==${CUDA_WHEEL_VERSION}"
  "nvidia-nvvm==${CUDA_WHEEL_VERSION}"
  "nvidia-cuda-runtime==${CUDA_WHEEL_VERSION}"
  "nvidia-cuda-cccl==${CUDA_WHEEL_VERSION}"
)

repo=$(cd "$(dirname "$0")/.." && pwd)
prefix="${KVX_TOOLCHAIN_DIR:-$repo/.toolchain}/cuda-${CUDA_WHEEL_VERSION}"
root="$prefix/nvidia/cu13"

if [ "${1:-}" != "--wheel" ]; then
  for cand in "${CUDA_HOME:-}" "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /nonexistent/bin/nvcc)")")" /usr/local/cuda; do
    if [ -n "$cand" ] && [ -x "$cand/bin/nvcc" ]; then
      echo "cuda-toolchain: using the system toolkit at $cand" >&2
      echo "$cand"
      exit 0
    fi
  done
fi

# The stamp is written last, so an interrupted install is redone rather than half-used. The
# lock serialises concurrent callers (make -j runs cuda-check and cuda-lib together); the
# second waits at most 10 minutes for the first's download.
stamp="$prefix/.complete"
mkdir -p "$(dirname "$prefix")"
exec 9>"$prefix.lock"
flock -w 600 9 || { echo "cuda-toolchain: timed out waiting for $prefix.lock" >&2; exit 1; }
if [ ! -f "$stamp" ]; then
  echo "cuda-toolchain: installing CUDA ${CUDA_WHEEL_VERSION} (nvcc, nvvm, crt, runtime, cccl) from PyPI into $prefix" >&2
  rm -rf "$prefix"
  mkdir -p "$prefix"
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-cache-dir --no-deps \
    --only-binary=:all: --target "$prefix" "${packages[@]}" >&2
  # nvcc links -lcudart; the wheel ships only the versioned soname.
  ln -sf libcudart.so.13 "$root/lib/libcudart.so"
  "$root/bin/nvcc" --version >&2
  touch "$stamp"
fi
echo "$root"
