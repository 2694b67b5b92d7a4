# SPDX-License-Identifier: Apache-2.0
# The UCX transport's targets (owner: ucx). Its C tests run in c-test (native/CMakeLists.txt)
# and its Go tests, two-process ones included, in go-test.

FUZZ_TARGETS += ./transfer:FuzzContextParams
# A peer's worker address: refused by native.CheckAddress or survived by UCX, tried in a child process.
FUZZ_TARGETS += ./native:FuzzWorkerAddress
MICROBENCH_TARGETS += bench-ucx
.PHONY: bench-ucx ucx-info

bench-ucx: ## Two-process transfer of the 4096-token request vs ucx_perftest tag_bw (ratio_to_perftest).
	$(GO) test -run '^$$' -bench 'Request4096Tokens_TwoProcesses' -benchtime 3x -timeout 20m ./native/

ucx-info: ## What UCX offers here: transports and devices (loopback tests use posix/cma and tcp on lo).
	ucx_info -v | sed -n 1,2p
	ucx_info -d | grep -E 'Transport|Device'


# The engine between two processes: the staging path, and the direct path in its RMA mode.
MICROBENCH_TARGETS += bench-ucx-engine
.PHONY: bench-ucx-engine
bench-ucx-engine: ## Two engines in two processes, 4096-token request vs ucx_perftest: staging, and RMA (one-copy).
	$(GO) test -run '^$$' -bench 'UCXTransport_Request4096' -benchtime 3x -timeout 20m ./transfer/
