# SPDX-License-Identifier: Apache-2.0
# ucx-cuda-env.sh, sourced (not run) by scripts/ucx-cuda-check.sh and scripts/gpu-test-ucx.sh:
# build against the CUDA-enabled UCX of the libucx-cu12 wheel (scripts/ucx-cuda.sh) and run
# against it. pkg-config finds its headers and libraries, the rpath makes the binaries load it
# rather than Debian's. Sets root to the wheel's UCX prefix.
root=$(scripts/ucx-cuda.sh)
export PKG_CONFIG_PATH="$root/lib/pkgconfig" CGO_LDFLAGS="-Wl,-rpath,$root/lib ${CGO_LDFLAGS:-}"
export PATH="$root/bin:$PATH" LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
