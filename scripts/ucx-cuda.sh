#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Prints the root of a CUDA-enabled UCX (lib/, include/, bin/, lib/pkgconfig/) on stdout.
#
# Debian's UCX (1.13.1) is built without CUDA, so it cannot move device memory. NVIDIA's
# libucx-cu12 wheel on PyPI ships UCX built with CUDA 12 (lib/ucx/libuct_cuda.so: the
# cuda_copy and cuda_ipc transports) together with its headers, pkg-config files and the
# ucx_perftest/ucx_info binaries. This script installs that wheel, pinned, into .toolchain/
# (git-ignored) once and reuses it, as scripts/cuda-toolchain.sh does for nvcc.
#
# The wheel's pkg-config files name the prefix of the machine that built it, and its binaries
# carry no rpath, so the install rewrites prefix= in a private copy of the .pc files and marks
# bin/* executable. To build against it and run what was built:
#
#   root=$(scripts/ucx-cuda.sh)
#   PKG_CONFIG_PATH=$root/lib/pkgconfig CGO_LDFLAGS="-Wl,-rpath,$root/lib" go build ...
#   LD_LIBRARY_PATH=$root/lib $root/bin/ucx_perftest ...
#
# The cuda transports load only where the CUDA driver (libcuda.so.1) exists; elsewhere this
# UCX runs host transports only, which is what `make ucx-cuda-check` relies on.
#
# KVX_UCX_WHEEL=/path/to/libucx_cu12-*.whl installs from a local copy instead of PyPI.
# Logs go to stderr; only the root goes to stdout.
set -euo pipefail

UCX_WHEEL_VERSION=1.22.0
package="libucx-cu12==${UCX_WHEEL_VERSION}"

repo=$(cd "$(dirname "$0")/.." && pwd)
prefix="${KVX_TOOLCHAIN_DIR:-$repo/.toolchain}/ucx-cu12-${UCX_WHEEL_VERSION}"
root="$prefix/libucx"

# The stamp is written last, so an interrupted install is redone rather than half-used; the
# lock serialises concurrent callers, the second waiting at most 10 minutes.
stamp="$prefix/.complete"
mkdir -p "$(dirname "$prefix")"
exec 9>"$prefix.lock"
flock -w 600 9 || { echo "ucx-cuda: timed out waiting for $prefix.lock" >&2; exit 1; }
if [ ! -f "$stamp" ]; then
  rm -rf "$prefix"
  mkdir -p "$prefix/download"
  if [ -n "${KVX_UCX_WHEEL:-}" ]; then
    echo "ucx-cuda: installing UCX ${UCX_WHEEL_VERSION} from $KVX_UCX_WHEEL into $prefix" >&2
    cp "$KVX_UCX_WHEEL" "$prefix/download/"
  else
    echo "ucx-cuda: installing UCX ${UCX_WHEEL_VERSION} with CUDA (PyPI $package, ~45 MB) into $prefix" >&2
    python3 -m pip download --quiet --disable-pip-version-check --no-cache-dir --no-deps \
      --only-binary=:all: --dest "$prefix/download" "$package" >&2
  fi
  wheel=$(ls "$prefix"/download/libucx_cu12-"${UCX_WHEEL_VERSION}"-*.whl 2>/dev/null | sed -n 1p)
  [ -n "$wheel" ] || { echo "ucx-cuda: no libucx_cu12-${UCX_WHEEL_VERSION} wheel in $prefix/download" >&2; exit 1; }
  python3 -m zipfile -e "$wheel" "$prefix" >&2
  rm -rf "$prefix/download"
  [ -f "$root/include/ucp/api/ucp.h" ] && [ -f "$root/lib/libucp.so" ] ||
    { echo "ucx-cuda: the wheel does not hold libucx/include/ucp/api/ucp.h and libucx/lib/libucp.so" >&2; exit 1; }
  # zip keeps no modes; and the .pc files name the builder's prefix.
  chmod +x "$root"/bin/*
  sed -i "s|^prefix *=.*|prefix = $root|" "$root"/lib/pkgconfig/*.pc
  PKG_CONFIG_PATH="$root/lib/pkgconfig" pkg-config --modversion ucx | grep -x "$UCX_WHEEL_VERSION" >/dev/null ||
    { echo "ucx-cuda: pkg-config does not report UCX $UCX_WHEEL_VERSION from $root/lib/pkgconfig" >&2; exit 1; }
  LD_LIBRARY_PATH="$root/lib" "$root/bin/ucx_info" -v >&2
  touch "$stamp"
fi
echo "$root"
