#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# cuda-check.sh: the kernel compile check behind `make cuda-check` (mk/cuda.mk).
#
#   cuda-check.sh compile ARCH LOG   compile cuda/kvx_cuda.cu for sm_ARCH to a cubin beside LOG
#                                    with nvcc (scripts/cuda-toolchain.sh), ptxas' report in LOG;
#                                    on a compile error print the log and fail
#   cuda-check.sh report LOG...      print registers and spills per kernel from each ptxas log
#                                    (named .../ptxas.sm_ARCH.log); fail on any spill, or on a
#                                    log with no kernel in it
#
# make keeps one log per architecture and recompiles only when a source changes, so a repeat
# `make test` prints the report from the logs instead of recompiling.
set -euo pipefail
cd "$(dirname "$0")/.."

# include/ holds kvx/kvx_layout.h, the layout header the kernels share with native/.
nvcc_flags=(-std=c++17 -O3 -Icuda -Iinclude --Werror all-warnings -Xptxas -v)

compile() {
	local arch=$1 log=$2 root
	root=$(scripts/cuda-toolchain.sh)
	mkdir -p "$(dirname "$log")"
	echo "cuda-check: $root/bin/nvcc -arch=sm_$arch -cubin cuda/kvx_cuda.cu"
	if ! "$root/bin/nvcc" "${nvcc_flags[@]}" -arch="sm_$arch" -cubin \
		-o "$(dirname "$log")/kvx_cuda.sm_$arch.cubin" cuda/kvx_cuda.cu >"$log.tmp" 2>&1; then
		cat "$log.tmp"
		rm -f "$log.tmp"
		echo "cuda-check: FAILED: kernels do not compile for sm_$arch"
		exit 1
	fi
	mv "$log.tmp" "$log"
}

# One report per log: each kernel's name, then its registers and spills; c++filt demangles
# the names when it is installed.
report() {
	local status=0 log arch archs=()
	for log in "$@"; do
		arch=${log##*/ptxas.}
		arch=${arch%.log}
		archs+=("$arch")
		awk -v arch="$arch" '
			/Compiling entry function/ { name = $0; sub(/.*function \047/, "", name); sub(/\047.*/, "", name); next }
			/spill stores/ { split($0, f, ","); stores = f[2] + 0; loads = f[3] + 0; next }
			/Used [0-9]+ registers/ { regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs); n++;
				printf "%s %s\n      registers %3d  spill stores %d  spill loads %d%s\n", arch, name, regs,
					stores, loads, (stores + loads > 0 ? "  <-- SPILLS" : "");
				if (stores + loads > 0) bad++ }
			END { if (n == 0) { print "cuda-check: no kernels in the ptxas report for " arch; exit 2 }
				if (bad) { printf "cuda-check: %d kernel(s) spill registers on %s\n", bad, arch; exit 1 } }' \
			"$log" | { command -v c++filt >/dev/null && c++filt || cat; } || status=1
	done
	if [ "$status" -ne 0 ]; then
		echo "cuda-check: FAILED (register spills are a defect: see above)"
		exit 1
	fi
	echo "cuda-check: kernels compile for ${archs[*]} without spills"
}

case "${1:-}" in
compile) [ $# -eq 3 ] || { echo "usage: cuda-check.sh compile ARCH LOG" >&2; exit 2; }; compile "$2" "$3" ;;
report) [ $# -ge 2 ] || { echo "usage: cuda-check.sh report LOG..." >&2; exit 2; }; shift; report "$@" ;;
*) echo "usage: cuda-check.sh compile ARCH LOG | report LOG..." >&2; exit 2 ;;
esac
