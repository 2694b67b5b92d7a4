# SPDX-License-Identifier: Apache-2.0
# The fault soak (issue 7): `make test` runs a 2-minute soak; `make soak` runs 30 minutes.
# Both run the same code as `kvxbench stress` (internal/stress.Command), built on its own so the
# soak does not wait on the rest of kvxbench. SOAK_FLAGS adds flags (`--json`, `--faults ...`).
#
# Where the UCX transport is in the tree, the soak is built with -tags stressucx and its second
# part runs the prefill side as peer processes (SIGSTOP, SIGKILL, and a network partition where
# network namespaces are allowed); otherwise only the in-process part runs.
TEST_TARGETS += soak-ci
.PHONY: soak-ci soak soak-build

SOAK_BIN := $(BUILD)/kvxsoak
SOAK_FLAGS ?=
SOAK_UCX := $(if $(wildcard transfer/ucx_transport.go),1,)

soak-build:
	$(GO) build $(if $(SOAK_UCX),-tags stressucx,) -o $(SOAK_BIN) ./internal/stress/soak

soak-ci: soak-build ## 2-minute fault soak: cancel storms, deadlines, hung/late/never-quiescent chunks, frozen, killed and partitioned peers.
ifeq ($(SOAK_UCX),1)
	$(SOAK_BIN) --duration 60s $(SOAK_FLAGS)
	$(SOAK_BIN) --processes --duration 50s --concurrency 64 $(SOAK_FLAGS)
else
	@echo "soak-ci: WARNING: no UCX transport in this tree: the peer-process part (SIGSTOP, SIGKILL, partition) is skipped"
	$(SOAK_BIN) --duration 2m $(SOAK_FLAGS)
endif

soak: soak-build ## 30-minute fault soak; prints the summary table, exits non-zero on any breach.
ifeq ($(SOAK_UCX),1)
	$(SOAK_BIN) --duration 15m $(SOAK_FLAGS)
	$(SOAK_BIN) --processes --duration 15m $(SOAK_FLAGS)
else
	$(SOAK_BIN) --duration 30m $(SOAK_FLAGS)
endif
