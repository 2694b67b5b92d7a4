# SPDX-License-Identifier: Apache-2.0
# Every path's figure beside its limit, alternating in one run (scripts/bench-paths.sh): RMA
# with the default lanes and with one, RMA against ucx_perftest ucp_get, TCP (the engine's
# choice and RMA) and staging against tag_bw. BENCH_PATHS_ROUNDS sets the rounds (default 3).

BENCH_PATHS_ROUNDS ?= 3
MICROBENCH_TARGETS += bench-paths
.PHONY: bench-paths

bench-paths: kvxbench ## Every path of the 4k-token request beside its limit, alternating in one run: lanes vs one lane, RMA vs ucp_get, TCP and staging vs tag_bw.
	scripts/bench-paths.sh $(KVXBENCH) $(BENCH_PATHS_ROUNDS)
