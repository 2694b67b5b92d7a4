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
.PHONY: ucx-info ucx-cuda-check ci-wheel go-test-wheel-ci

UCX_CUDA_BUILD := $(BUILD)/ucx-cuda

ucx-info: ## What UCX offers here: transports and devices (loopback tests use posix/cma and tcp on lo).
	ucx_info -v | sed -n 1,2p
	ucx_info -d | grep -E 'Transport|Device'

ucx-cuda-check: ## Build native/, transfer/, kvxbench against UCX 1.22 (libucx-cu12 wheel) and run host-memory UCX tests with it.
	@GO=$(GO) scripts/ucx-cuda-check.sh $(UCX_CUDA_BUILD)

# CI's leg against the wheel's UCX 1.22 (.ci/run runs it after `make test`). The whole suite
# twice does not fit CI's 40 minutes on 2 cores (`make test` took 12.9 minutes in the clean-clone
# rehearsal of 2026-11-29 17:22 UTC; the first `make test UCX=wheel` took 25, compiles included,
# docs/benchmarks.md "`make test`'s time"), so this leg runs what
# depends on the UCX version: the C tests under ASan/UBSan, every test of native/ and of the UCX
# transport, and of transfer/ and the soak the tests over real UCX named below (the lifecycle
# over a leaving, killed or frozen peer process, every path, RMA, the peer-process soak).
# `make test UCX=wheel` still runs everything against it.
WHEEL_CI_TRANSFER_TESTS ?= ^(TestL[0-9]+_UCX|TestUCX)
WHEEL_CI_STRESS_TESTS ?= ^TestProcessSoak

ci-wheel: ## CI's leg against UCX 1.22 (the wheel): c-test, native/ and the UCX transport, transfer/'s and the soak's real-UCX tests.
	@$(MAKE) --no-print-directory UCX=wheel c-test go-test-wheel-ci

go-test-wheel-ci:
	$(GO) test -race -count=1 -timeout 25m ./native/ ./transfer/transport/ucx/
	$(GO) test -race -count=1 -timeout 25m -run '$(WHEEL_CI_TRANSFER_TESTS)' ./transfer/
	$(GO) test -race -count=1 -timeout 25m -run '$(WHEEL_CI_STRESS_TESTS)' ./internal/stress/
