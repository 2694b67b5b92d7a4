# SPDX-License-Identifier: Apache-2.0
# kvxfer build. `make help` lists the targets. Every target installs what it needs first.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
# Under pipefail a reader that stops early (grep -q, head) can make the writer die of SIGPIPE
# and the pipe fail at random; recipes and scripts use readers that read everything
# (grep >/dev/null, sed -n 1p). A clean-clone CI run failed on `ldd | grep -q` once.
GO ?= go
BUILD ?= build
export CGO_ENABLED := 1
# go-nvml's bindings call NVML functions NVIDIA has deprecated; their warnings are not ours.
export CGO_CFLAGS ?= -g -O2 -Wno-deprecated-declarations

# Fragments in mk/ add their own targets to these lists.
TEST_TARGETS := go-tidy go-vet go-test c-test go-fuzz
# `make bench` is the one main job (mk/bench.mk makes it `kvxbench run`); the package
# benchmarks behind each target are in MICROBENCH_TARGETS, run together by `make bench-all`.
BENCH_TARGETS := bench-gather
MICROBENCH_TARGETS := bench-gather
# Fuzz targets run for FUZZ_TIME each in `make test`, as package:FuzzName.
FUZZ_TARGETS := ./layout:FuzzPlan
FUZZ_TIME ?= 10s
-include mk/*.mk

.DEFAULT_GOAL := help
.PHONY: help deps build test bench bench-all go-tidy go-vet go-test c-test go-fuzz bench-gather

help: ## List the targets.
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sort -u | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  %-12s %s\n", $$1, $$2}'

deps: ## Install Debian packages (libucx-dev, cmake, pkg-config, ...) and Go modules when missing.
	@scripts/deps.sh

build: deps ## Build the Go packages, kvxbench and the C library.
	$(GO) build ./...
	cmake -S . -B $(BUILD)/release -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD)/release -j2

test: deps ## Everything a change must pass: go vet, Go tests with -race, C tests under ASan/UBSan, kernel compile check.
	@$(MAKE) --no-print-directory $(TEST_TARGETS)

# go.mod and go.sum must be what `go mod tidy` makes: direct requirements marked as such, none
# missing or left over. `-diff` changes nothing and fails, printing the diff, when they are not.
go-tidy:
	$(GO) mod tidy -diff

go-vet:
	$(GO) vet ./...

go-test:
	$(GO) test -race -count=1 -timeout 20m ./...

c-test: ## C tests (ctest) built with AddressSanitizer and UndefinedBehaviorSanitizer.
	cmake -S . -B $(BUILD)/asan -DCMAKE_BUILD_TYPE=Debug -DKVX_SANITIZE=ON >/dev/null
	cmake --build $(BUILD)/asan -j2
	cd $(BUILD)/asan && ctest --output-on-failure --timeout 300

go-fuzz: ## Run every fuzz target for FUZZ_TIME (default 10s).
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} in $${t%%:*} for $(FUZZ_TIME)"; \
		scripts/fuzz.sh $(GO) "$${t%%:*}" "$${t#*:}" $(FUZZ_TIME) || exit 1; \
	done

bench-gather: ## Host gather/scatter of a Llama-3-8B 4096-token request against memcpy.
	$(GO) test -run '^$$' -bench 'Gather|Scatter' -benchtime 10x ./native/

bench: deps ## The main job: the loopback transfer benchmark with its embedded default configuration.
	@$(MAKE) --no-print-directory $(BENCH_TARGETS)

bench-all: deps ## The main job, then every package benchmark (gather, lifecycle, UCX, streaming, metrics).
	@$(MAKE) --no-print-directory $(BENCH_TARGETS) $(MICROBENCH_TARGETS)
