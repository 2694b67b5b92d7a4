# SPDX-License-Identifier: Apache-2.0
# UCX: what UCX offers on this host, and kvxfer against a second UCX. The UCX layer's C tests
# run in c-test (native/CMakeLists.txt), its Go tests, two-process ones included, in go-test,
# its fuzz target in go-fuzz, its benchmarks in mk/bench.mk.
#
#   ucx-cuda-check  no GPU needed: build native/, transfer/ and kvxbench against the UCX 1.22 of
#                   the libucx-cu12 wheel (pinned in scripts/ucx-cuda.sh) beside Debian's 1.13,
#                   run host-memory UCX tests with it, check that this UCX reports CUDA memory
#                   exactly when a driver is present, and that `kvxbench run --memory device`
#                   stops in one line, non-zero, on a host without a GPU
#                   (scripts/ucx-cuda-check.sh, which says which tests run and why).
#
# ucx-cuda-check is part of `make test`: the device path is built against this UCX on GPU
# hosts, so drifting away from it must fail here, on every host. It costs about 20 s after a
# change to native/ (it compiles native/, transfer/ and kvxbench a second time, against the
# other UCX) and 7 s when nothing changed, and fetches the 45 MB wheel from PyPI once, as
# cuda-check fetches nvcc. `make gpu-test` (mk/cuda.mk) builds the same way and runs the device
# transfer.
.PHONY: ucx-info ucx-cuda-check

UCX_CUDA_BUILD := $(BUILD)/ucx-cuda

ucx-info: ## What UCX offers here: transports and devices (loopback tests use posix/cma and tcp on lo).
	ucx_info -v | sed -n 1,2p
	ucx_info -d | grep -E 'Transport|Device'

ucx-cuda-check: ## Build native/, transfer/, kvxbench against UCX 1.22 (libucx-cu12 wheel) and run host-memory UCX tests with it.
	@GO=$(GO) scripts/ucx-cuda-check.sh $(UCX_CUDA_BUILD)
