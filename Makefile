# SPDX-License-Identifier: Apache-2.0
# kvxfer build. `make help` lists every target by subject; the main ones:
#
#   make test       everything a change must pass (the list is TEST_TARGETS below)
#   make bench      the main benchmark: kvxbench run, two processes over UCX
#   make bench-all  the main benchmark, then every package benchmark
#   make build      the Go packages and the C library; make deps installs what is missing
#
# The targets live by subject in mk/, each fragment's recipes in scripts/ when longer than a
# few lines:
#
#   mk/go.mk     go-tidy go-vet go-imports go-test go-fuzz; the examples: serving-test pair disagg disagg-ucx
#   mk/c.mk      c-test (the C tests under ASan/UBSan)
#   mk/cuda.mk   cuda-check cuda-lib cuda-vet; the GPU CI job: gpu-test gpu-test-ucx
#   mk/ucx.mk    ucx-info ucx-cuda-check ci-wheel (kvxfer against the CUDA-enabled UCX 1.22)
#   mk/bench.mk  kvxbench, bench-kvxbench and every bench-* target
#   mk/soak.mk   soak-ci (in make test), soak (30 minutes)
#
# Every target installs what it needs first.
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

# What `make test` runs, in this order.
TEST_TARGETS := go-tidy go-vet go-nocgo go-imports go-test c-test go-fuzz cuda-check cuda-vet soak-ci ucx-cuda-check

# Which UCX the build uses. system (the default): the distribution's, found by pkg-config
# (Debian's 1.13.1 here, what a host without a GPU runs). wheel: the CUDA-enabled UCX 1.22 of
# NVIDIA's libucx-cu12 wheel, which a GPU host runs (scripts/ucx-cuda.sh installs it into
# .toolchain/, or KVX_TOOLCHAIN_DIR): `make test UCX=wheel` builds and runs the whole Go suite,
# the C tests and soak-ci against it, what depends on the UCX in $(UCX_BUILD) = build/ucx-wheel
# (docs/ucx.md, "Which UCX").
UCX ?= system
UCX_BUILD := $(BUILD)
ifeq ($(UCX),wheel)
UCX_ROOT := $(shell scripts/ucx-cuda.sh)
ifeq ($(UCX_ROOT),)
$(error UCX=wheel: scripts/ucx-cuda.sh could not install the wheel's UCX)
endif
UCX_BUILD := $(BUILD)/ucx-wheel
export PKG_CONFIG_PATH := $(UCX_ROOT)/lib/pkgconfig
export CGO_LDFLAGS := -Wl,-rpath,$(UCX_ROOT)/lib $(CGO_LDFLAGS)
export LD_LIBRARY_PATH := $(UCX_ROOT)/lib$(if $(LD_LIBRARY_PATH),:$(LD_LIBRARY_PATH))
export PATH := $(UCX_ROOT)/bin:$(PATH)
C_CMAKE_FLAGS := -DCMAKE_PREFIX_PATH=$(UCX_ROOT)
TEST_TARGETS := go-test c-test soak-ci
else ifneq ($(UCX),system)
$(error UCX=$(UCX): system or wheel)
endif

include mk/go.mk mk/c.mk mk/cuda.mk mk/ucx.mk mk/bench.mk mk/soak.mk

.DEFAULT_GOAL := help
.PHONY: help deps build test

# One block per file: the Makefile's own targets, then each fragment's under its name.
help: ## List the targets by subject.
	@for f in $(MAKEFILE_LIST); do \
		awk -v f="$$f" 'BEGIN { FS = ":.*## " } \
			/^[a-zA-Z_-]+:.*## / { if (!n++) printf "%s\n", (f == "Makefile" ? "main" : f); \
				printf "  %-22s %s\n", $$1, $$2 }' "$$f"; \
	done

deps: ## Install Debian packages (libucx-dev, cmake, pkg-config, ...) and Go modules when missing.
	@scripts/deps.sh

build: deps ## Build the Go packages, kvxbench and the C library.
	$(GO) build ./...
	cmake -S . -B $(BUILD)/release -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD)/release -j2

test: deps ## Everything a change must pass: go vet, Go tests with -race, C tests under ASan/UBSan, kernel compile check.
	@$(MAKE) --no-print-directory $(TEST_TARGETS)
