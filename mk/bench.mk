# SPDX-License-Identifier: Apache-2.0
# Benchmarks. `make bench` is the one main job, kvxbench run (cmd/kvxbench); `make bench-all`
# runs it, then every package benchmark and kvxbench comparison (MICROBENCH_TARGETS, in order).
.PHONY: bench bench-all kvxbench bench-kvxbench bench-kvxbench-gather bench-gather \
	bench-lifecycle bench-onecopy bench-paths bench-auth bench-rma bench-observe bench-stream bench-ucx \
	bench-ucx-engine

BENCH_TARGETS := bench-kvxbench
MICROBENCH_TARGETS := bench-gather bench-lifecycle bench-onecopy bench-paths bench-auth bench-rma \
	bench-observe bench-stream bench-ucx bench-ucx-engine

KVXBENCH ?= $(BUILD)/kvxbench
# Flags for the kvxbench targets, such as KVXBENCH_FLAGS='--json --plot bench.svg'.
KVXBENCH_FLAGS ?=
# Rounds of bench-paths (scripts/bench-paths.sh).
BENCH_PATHS_ROUNDS ?= 3

bench: deps ## The main job: the loopback transfer benchmark with its embedded default configuration.
	@$(MAKE) --no-print-directory $(BENCH_TARGETS)

bench-all: deps ## The main job, then every package benchmark (gather, lifecycle, UCX, streaming, metrics).
	@$(MAKE) --no-print-directory $(BENCH_TARGETS) $(MICROBENCH_TARGETS)

# --- kvxbench --------------------------------------------------------------------------------
kvxbench: ## Build the benchmark binary into $(BUILD)/kvxbench.
	@mkdir -p $(BUILD)
	$(GO) build -o $(KVXBENCH) ./cmd/kvxbench

bench-kvxbench: kvxbench ## kvxbench run: Llama-3-8B 1k/4k/16k-token transfers between two processes, beside ucx_perftest.
	$(KVXBENCH) run $(KVXBENCH_FLAGS)

bench-kvxbench-gather: kvxbench ## kvxbench gather: host gather and scatter of 1k/4k/16k-token requests against memcpy.
	$(KVXBENCH) gather $(KVXBENCH_FLAGS)

# The direct path (docs/onecopy.md): the 4k-token request over shared memory, each run beside
# ucx_perftest at its own message size.
bench-onecopy: kvxbench ## kvxbench run of the 4k-token request over shared memory: direct path, then --staging (ratio of each).
	$(KVXBENCH) run --tls posix,cma,self --prompts 4k --concurrency 1 $(KVXBENCH_FLAGS)
	$(KVXBENCH) run --tls posix,cma,self --prompts 4k --concurrency 1 --staging $(KVXBENCH_FLAGS)

# RMA gets then IOV messages (--no-rma), three alternating pairs: the host is noisy, so the
# pairs alternate and every ratio is printed.
bench-rma: kvxbench ## kvxbench run of the 4k-token request over shared memory: RMA mode, then --no-rma, three times (ratio of each).
	@for i in 1 2 3; do \
		$(KVXBENCH) run --json --tls posix,cma,self --prompts 4k --concurrency 1 --duration 3s $(KVXBENCH_FLAGS) || exit 1; \
		$(KVXBENCH) run --json --tls posix,cma,self --prompts 4k --concurrency 1 --duration 3s --no-rma $(KVXBENCH_FLAGS) || exit 1; \
	done

# Every path's figure beside its limit, alternating in one run: RMA with the default lanes and
# with one, RMA against ucx_perftest ucp_get, TCP (the engine's choice and RMA) and staging
# against tag_bw.
bench-paths: kvxbench ## Every path of the 4k-token request beside its limit, alternating in one run: lanes vs one lane, RMA vs ucp_get, TCP and staging vs tag_bw.
	scripts/bench-paths.sh $(KVXBENCH) $(BENCH_PATHS_ROUNDS)

# A cluster key's cost on every path: the 4k-token request without and with --cluster-key,
# alternating in one run (docs/security.md, "What a cluster key costs").
bench-auth: kvxbench ## Every path of the 4k-token request without and with a cluster key, alternating pairs in one run: keyed over unkeyed GB/s per path.
	scripts/bench-auth.sh $(KVXBENCH) $(BENCH_PATHS_ROUNDS)

# --- package benchmarks (go test -bench) ----------------------------------------------------
bench-gather: ## Host gather/scatter of a Llama-3-8B 4096-token request against memcpy.
	$(GO) test -run '^$$' -bench 'Gather|Scatter' -benchtime 10x ./native/

bench-lifecycle: ## Engine benchmarks: Status, Cancel, and throughput with 10 vs 10,000 transfers in flight.
	$(GO) test -run '^$$' -bench 'Status|Cancel|ManyInFlight' -benchtime 2s ./transfer/

bench-observe: ## Observer cost per transfer and the cost of one /metrics scrape.
	$(GO) test -run '^$$' -bench 'Metrics_Transfer|Handler_Scrape' -benchtime 2s ./transfer/observe/

bench-stream: ## Streamed transfer beside simulated prefill: exposed_us, plain_us, exposed_ratio (Llama-3-8B, 4096 tokens; in-memory and UCX).
	$(GO) test -run '^$$' -bench Stream -benchtime 1x -v ./internal/streambench/

bench-ucx: ## Two-process transfer of the 4096-token request vs ucx_perftest tag_bw (ratio_to_perftest).
	$(GO) test -run '^$$' -bench 'Request4096Tokens_TwoProcesses' -benchtime 3x -timeout 20m ./native/

# The engine between two processes: the staging path, and the direct path in its RMA mode.
bench-ucx-engine: ## Two engines in two processes, 4096-token request vs ucx_perftest: staging, and RMA (one-copy).
	$(GO) test -run '^$$' -bench 'UCXTransport_Request4096' -benchtime 3x -timeout 20m ./transfer/
