# SPDX-License-Identifier: Apache-2.0
# The fault soak (issue 7): `make test` runs a 2-minute soak; `make soak` runs 30 minutes.
# Both run the same code as `kvxbench stress` (internal/stress.Command), built on its own so the
# soak does not wait on the rest of kvxbench. SOAK_FLAGS adds flags (`--json`, `--faults ...`).
TEST_TARGETS += soak-ci
.PHONY: soak-ci soak

SOAK_BIN := $(BUILD)/kvxsoak
SOAK_FLAGS ?=

soak-ci: ## 2-minute fault soak: cancel storms, deadlines, hung/late/never-quiescent chunks, a frozen and a killed peer.
	$(GO) build -o $(SOAK_BIN) ./internal/stress/soak
	$(SOAK_BIN) --duration 2m $(SOAK_FLAGS)

soak: ## 30-minute fault soak; prints the summary table, exits non-zero on any breach.
	$(GO) build -o $(SOAK_BIN) ./internal/stress/soak
	$(SOAK_BIN) --duration 30m $(SOAK_FLAGS)
