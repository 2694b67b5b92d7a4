# SPDX-License-Identifier: Apache-2.0
# kvxbench: the transfer benchmark (cmd/kvxbench). Included by the Makefile after its defaults.

KVXBENCH ?= $(BUILD)/kvxbench
# Flags for the bench targets, such as KVXBENCH_FLAGS='--json --plot bench.svg'.
KVXBENCH_FLAGS ?=

# `make bench` is the loopback transfer benchmark: kvxbench run with no flags.
BENCH_TARGETS := bench-kvxbench

.PHONY: kvxbench bench-kvxbench bench-kvxbench-gather

kvxbench: ## Build the benchmark binary into $(BUILD)/kvxbench.
	@mkdir -p $(BUILD)
	$(GO) build -o $(KVXBENCH) ./cmd/kvxbench

bench-kvxbench: kvxbench ## kvxbench run: Llama-3-8B 1k/4k/16k-token transfers between two processes, beside ucx_perftest.
	$(KVXBENCH) run $(KVXBENCH_FLAGS)

bench-kvxbench-gather: kvxbench ## kvxbench gather: host gather and scatter of 1k/4k/16k-token requests against memcpy.
	$(KVXBENCH) gather $(KVXBENCH_FLAGS)
