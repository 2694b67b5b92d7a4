#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gpu-bundle.sh STAGEDIR ARCHIVE: `make gpu-bundle` (mk/cuda.mk). Builds on this host, with no
# GPU, everything scripts/gpu-run.sh needs on a GPU machine that has the driver but no Go, no
# UCX and no package registry, and packs it into ARCHIVE (.tar.xz: GNU tar and python3's tarfile
# both unpack it). STAGEDIR is emptied and refilled with the archive's one directory,
# kvxfer-gpu/:
#
#   bin/cuda.test         cuda/ with the gpu tag and -race: the kernel tests (gpu-test.sh's)
#   bin/cuda-bench.test   the same without -race, for BenchmarkGPU_Llama3_8B
#   bin/native.test, bin/transfer.test, bin/ucx.test
#                         native/, transfer/, transfer/transport/ucx/ with the gpu tag and
#                         -race, against the wheel's UCX (gpu-test-ucx.sh's device tests)
#   bin/transfer-norace.test
#                         transfer/ the same without -race: the two-process device rma test
#                         beside the race build's (its reader ran 100 times slower, 2026-11-29)
#   bin/ucxpeer, bin/enginepeer
#                         the two-process tests' peers (internal/peerproc: KVX_UCXPEER_BIN,
#                         KVX_ENGINEPEER_BIN), built as `go build` builds them at test time
#   bin/kvxbench          kvxbench (it re-executes itself for its peer)
#   lib/libkvxcuda.so     the kernels for sm_80 and sm_90 ($(BUILD)/cuda from `make cuda-lib`)
#   lib/libcudart.so.13   the CUDA runtime of scripts/cuda-toolchain.sh, so the GPU machine runs
#                         what was tested here whatever CUDA it has installed
#   ucx/                  the libucx-cu12 wheel's UCX 1.22 (scripts/ucx-cuda.sh): its shared
#                         libraries, lib/ucx modules (cuda_copy, cuda_ipc), the libraries those
#                         modules load from ../../../libucx_cu12.libs, ucx_info, ucx_perftest
#   MANIFEST              what was built from which commit, with each file's size
#
# Every Go binary is stripped (-ldflags='-s -w') and carries the rpath $ORIGIN/../ucx/libucx/lib,
# so it loads the bundle's UCX wherever the archive is unpacked; gpu-run.sh sets
# LD_LIBRARY_PATH too. GO names the go command (default: go).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
[ $# -eq 2 ] || { echo "usage: gpu-bundle.sh STAGEDIR ARCHIVE" >&2; exit 2; }
stage=$1 archive=$2
[ -f build/cuda/libkvxcuda.so ] || { echo "gpu-bundle: no build/cuda/libkvxcuda.so; run make cuda-lib" >&2; exit 1; }

cuda=$(scripts/cuda-toolchain.sh --wheel)
cudart=$cuda/lib/libcudart.so.13
[ -f "$cudart" ] || { echo "gpu-bundle: no $cudart" >&2; exit 1; }
ucx=$(scripts/ucx-cuda.sh)
wheel=$(dirname "$ucx")
[ -d "$wheel/libucx_cu12.libs" ] || { echo "gpu-bundle: no $wheel/libucx_cu12.libs (the wheel's bundled libcudart 12 and libgomp)" >&2; exit 1; }

rm -rf "$stage"
dir=$stage/kvxfer-gpu
mkdir -p "$dir/bin" "$dir/lib" "$dir/ucx/libucx/bin" "$dir/ucx/libucx/lib/ucx"
dir=$(cd "$dir" && pwd) # ldd prints absolute paths

# Build against the wheel's UCX; the rpath is literal $ORIGIN (the linker gets it unexpanded).
export PKG_CONFIG_PATH="$ucx/lib/pkgconfig"
export CGO_LDFLAGS="-Wl,-rpath,\$ORIGIN/../ucx/libucx/lib ${CGO_LDFLAGS:-}"
echo "gpu-bundle: building against UCX $(pkg-config --modversion ucx) at $ucx"
strip=(-ldflags='-s -w')
"$GO" test -c -tags gpu -race "${strip[@]}" -o "$dir/bin/cuda.test" ./cuda
"$GO" test -c -tags gpu "${strip[@]}" -o "$dir/bin/cuda-bench.test" ./cuda
"$GO" test -c -tags gpu -race "${strip[@]}" -o "$dir/bin/native.test" ./native
"$GO" test -c -tags gpu -race "${strip[@]}" -o "$dir/bin/transfer.test" ./transfer
"$GO" test -c -tags gpu "${strip[@]}" -o "$dir/bin/transfer-norace.test" ./transfer
"$GO" test -c -tags gpu -race "${strip[@]}" -o "$dir/bin/ucx.test" ./transfer/transport/ucx
"$GO" build "${strip[@]}" -o "$dir/bin/ucxpeer" ./native/internal/ucxpeer
"$GO" build "${strip[@]}" -o "$dir/bin/enginepeer" ./transfer/internal/enginepeer
"$GO" build "${strip[@]}" -o "$dir/bin/kvxbench" ./cmd/kvxbench

# libkvxcuda.so links libcudart dynamically (one runtime, shared with the Go loader), so it must
# want the soname shipped here: cuda-lib builds with a system toolkit where there is one.
want=$(readelf -d build/cuda/libkvxcuda.so | sed -n 's/.*NEEDED.*\[\(libcudart\.so\.[0-9]*\)\].*/\1/p')
[ "$want" = "$(basename "$cudart")" ] || { echo "gpu-bundle: build/cuda/libkvxcuda.so needs ${want:-no libcudart}," \
	"the bundle ships $(basename "$cudart"); rebuild it with the PyPI CUDA 13 (CUDA_HOME=$cuda make cuda-lib)" >&2; exit 1; }
cp build/cuda/libkvxcuda.so "$dir/lib/"
cp "$cudart" "$dir/lib/"
# Shared objects only (the wheel's static archives and headers are half its size), symlinks kept.
cp -a "$ucx"/lib/lib*.so* "$dir/ucx/libucx/lib/"
cp -a "$ucx"/lib/ucx/lib*.so* "$dir/ucx/libucx/lib/ucx/"
cp -a "$ucx/bin/ucx_info" "$ucx/bin/ucx_perftest" "$dir/ucx/libucx/bin/"
cp -a "$wheel/libucx_cu12.libs" "$dir/ucx/"
# A wheel is a zip, which has no symlinks: libucp.so, .so.0 and .so.0.0.0 are three copies of
# 10 MiB. Keep the real file once and link the other names to it.
for f in "$dir"/ucx/libucx/lib/lib*.so.*.*.* "$dir"/ucx/libucx/lib/ucx/lib*.so.*.*.*; do
	base=${f%.so.*}
	for alias in "$base.so" "${f%.*.*}"; do
		if cmp -s "$f" "$alias"; then ln -sf "$(basename "$f")" "$alias"; fi
	done
done

# Each binary must find the bundle's UCX through its rpath alone: nothing "not found", and
# libucp from the bundle, not this host's.
for b in "$dir"/bin/*; do
	deps=$(ldd "$b" 2>&1 || true)
	if printf '%s\n' "$deps" | grep 'not found' >/dev/null; then
		echo "gpu-bundle: $b misses libraries:"; printf '%s\n' "$deps"; exit 1
	fi
	case "$b" in */cuda.test | */cuda-bench.test) continue ;; esac # purego: no link-time UCX
	printf '%s\n' "$deps" | grep -F "=> $dir/bin/../ucx/libucx/lib/libucp.so" >/dev/null ||
		{ echo "gpu-bundle: $b does not load the bundle's libucp:"; printf '%s\n' "$deps" | grep uc; exit 1; }
done

{
	echo "kvxfer GPU bundle (scripts/gpu-bundle.sh; run it with scripts/gpu-run.sh)"
	echo "commit: $(git rev-parse HEAD)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
	echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m) with $("$GO" version | cut -d' ' -f3)"
	echo "ucx: $(pkg-config --modversion ucx) (libucx-cu12 wheel); cudart: $(basename "$(readlink -f "$cudart")"); kernels: sm_80, sm_90"
	(cd "$dir" && find . -type f -printf '%10s  %P\n' | sort -k2)
} >"$dir/MANIFEST"

mkdir -p "$(dirname "$archive")"
tar -C "$stage" -cf - kvxfer-gpu | xz -T2 -6 >"$archive.tmp"
mv "$archive.tmp" "$archive"
size=$(stat -c %s "$archive")
limit=$((48 << 20)) # the device tool carries 64 MiB with the tree; keep a margin for it
echo "gpu-bundle: $archive: $size bytes ($((size >> 20)) MiB; unpacked $(du -sm "$dir" | cut -f1) MiB)"
[ "$size" -le "$limit" ] || { echo "gpu-bundle: $archive is over $limit bytes: it must travel with the tree in 64 MiB"; exit 1; }
