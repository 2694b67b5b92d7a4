# SPDX-License-Identifier: Apache-2.0
# kvxbench: the transfer benchmark (cmd/kvxbench). Included by the Makefile after its defaults.

KVXBENCH ?= $(BUILD)/kvxbench
# Flags for `make bench`, such as KVXBENCH_FLAGS='--json --plot bench.svg'.
KVXBENCH_FLAGS ?=

.PHONY: kvxbench bench-kvxbench bench-kvxbench-gather

kvxbench: ## Build the benchmark binary into $(BUILD)/kvxbench.
	@mkdir -p $(BUILD)
	$(GO) build -o $(KVXBENCH) ./cmd/kvxbench

bench-kvxbench-gather: kvxbench ## Host gather and scatter of 1k, 4k and 16k-token Llama-3-8B requests against memcpy.
	$(KVXBENCH) gather $(KVXBENCH_FLAGS)
