#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ucx-cuda-check.sh BUILDDIR: `make ucx-cuda-check` (mk/ucx.mk). No GPU needed: build native/,
# transfer/ and kvxbench against the libucx-cu12 wheel's UCX 1.22 into BUILDDIR, run host-memory
# UCX tests with it (API and ABI compatibility with a newer UCX than Debian's 1.13; the
# gpu-tagged tests are vetted against its headers too), check that this UCX reports CUDA memory
# exactly when a driver is present, and that `kvxbench run --memory device` stops in one line,
# non-zero, on a host without a GPU. GO names the go command (default: go).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
[ $# -eq 1 ] || { echo "usage: ucx-cuda-check.sh BUILDDIR" >&2; exit 2; }
mkdir -p "$1"
build=$(cd "$1" && pwd)

# The host-memory tests run against UCX 1.22: a selection, the UCX API and the transports'
# contract (the whole suite against it is `make test UCX=wheel`). The forced-close tests check
# the per-version rendezvous default: an 8 MiB send nobody receives stays with its sender on
# 1.22 too ("am"; docs/ucx.md, "UCX 1.22"). The RMA-emulation tests check that a context
# without RMA serves a peer's keyless put and get on 1.22 no more than on 1.13, and that
# native refuses its own (1.22's UCX checks no feature flags: docs/security.md).
native_tests='StatusCodes|ForceCloseCompletesInflight|LoopbackUsesSharedMemory|TaggedTransfersEveryByte|ManySmallMessages|RMAPutGet|CancelUnmatched|TestL6_|TestL2_|InvalidRanges|MemoryType|DeviceMemory|RegisterRefuses|DeviceOps|RunOnThread|RMAEmulationServesAPeer|NoRMAContextRefuses'
transfer_tests='TestUCXTransport_TwoEnginesEveryByteChecked|TestUCXDirect_EveryByteAcrossLayouts|TestUCXDevice_|TestUCXRegion_'
ucx_tests='TestUCXTransport_Contract(ControlAndData|RefusesGoMemory|RefusesCollidingReceives|Cancel|ForceCloseReportsEveryOp)|TestUCXDevice_|TestUCXRegion_|TestUCXTransport_TCPOnlyServesNoRMA'

. scripts/ucx-cuda-env.sh
echo "ucx-cuda-check: building against $(pkg-config --modversion ucx) at $root"
"$GO" test -c -o "$build/native.test" ./native
"$GO" test -c -o "$build/transfer.test" ./transfer
"$GO" test -c -o "$build/ucx.test" ./transfer/transport/ucx
"$GO" build -o "$build/kvxbench" ./cmd/kvxbench
"$GO" vet -tags gpu ./native/ ./transfer/... ./cmd/kvxbench/ ./internal/bench/...
for b in native.test transfer.test ucx.test kvxbench; do
	ldd "$build/$b" | grep -F "$root/lib/libucp.so" >/dev/null ||
		{ echo "ucx-cuda-check: $b does not load $root/lib/libucp.so"; ldd "$build/$b" | grep uc; exit 1; }
done

gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep '^GPU ' >/dev/null; then gpu=1; fi
export KVX_EXPECT_UCX_CUDA=$gpu KVX_EXPECT_UCX_VERSION=1.22
echo "ucx-cuda-check: host-memory UCX tests against UCX 1.22 (CUDA memory expected: $gpu)"
# Each test binary runs in its package directory (testdata), with UCX's mpool warnings at exit
# filtered out.
(cd native && "$build/native.test" -test.count=1 -test.timeout 5m -test.run "$native_tests" 2>&1 | grep -v 'was not returned to mpool')
(cd transfer && "$build/transfer.test" -test.count=1 -test.timeout 5m -test.run "$transfer_tests" 2>&1 | grep -v 'was not returned to mpool')
(cd transfer/transport/ucx && "$build/ucx.test" -test.count=1 -test.timeout 5m -test.run "$ucx_tests" 2>&1 | grep -v 'was not returned to mpool')

if [ "$gpu" = 0 ]; then
	out=$("$build/kvxbench" run --memory device --prompts 1k --concurrency 1 2>&1) &&
		{ echo "ucx-cuda-check: kvxbench run --memory device succeeded on a host without a GPU: $out"; exit 1; }
	[ "$(printf '%s\n' "$out" | wc -l)" = 1 ] && case "$out" in "kvxbench: --memory device: "*) true ;; *) false ;; esac ||
		{ echo "ucx-cuda-check: expected one line 'kvxbench: --memory device: ...', got:"; echo "$out"; exit 1; }
	echo "ucx-cuda-check: kvxbench run --memory device without a GPU: $out"
fi
echo "ucx-cuda-check: OK (UCX $(pkg-config --modversion ucx))"
