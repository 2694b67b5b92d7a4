# SPDX-License-Identifier: Apache-2.0
# Soak: the fault soak. `make test` runs a 2-minute soak; `make soak` runs 30 minutes.
# Both run the same code as `kvxbench stress` (internal/stress.Command), built on its own so the
# soak does not wait on the rest of kvxbench. SOAK_FLAGS adds flags (`--json`, `--faults ...`).
# Each run has two parts: the in-process soak (every chunk-level fault) and the peer-process
# soak over UCX (a mix of every path through registered pools; SIGSTOP, SIGKILL, rolling
# restarts, and a cut and lossy network where namespaces are allowed: nftables and tc, which
# scripts/deps.sh installs).
.PHONY: soak-ci soak soak-build

SOAK_BIN := $(UCX_BUILD)/kvxsoak
SOAK_FLAGS ?=

soak-build: ## Build the soak driver into $(BUILD)/kvxsoak.
	$(GO) build -o $(SOAK_BIN) ./internal/stress/soak

# Both parts run even when the first fails, so one run shows every breach; either failing fails
# the target.
soak-ci: soak-build ## 2-minute fault soak: cancel storms, deadlines, hung/late/never-quiescent chunks, frozen, killed, restarted and partitioned peers, a lossy link, every path.
	@rc=0; \
	$(SOAK_BIN) --duration 60s $(SOAK_FLAGS) || rc=1; \
	$(SOAK_BIN) --processes --duration 60s --concurrency 64 --faults $(SOAK_CI_PROCESS_FAULTS) $(SOAK_FLAGS) || rc=1; \
	exit $$rc

# The peer-process soak's faults in soak-ci. SIGSTOP/SIGCONT was once left out (a frozen prefill
# process's late chunks stranded its slots until they were poisoned); the UCX transport now
# drains cancelled receives' tags (docs/ucx.md), and the freeze is back. The lifecycle faults
# (restart, dead-peer, freeze-paths: docs/stress.md) were left out for a while: one of two 60 s
# runs with them crashed the soak process itself (SIGSEGV at 0x38 in C code). That was UCX 1.13
# failing to attach the segment of a remote key whose peer had just released it or died, after
# native had checked it; native now holds the segment from its check until UCX attached it
# (docs/security.md, "Remote keys"), and the lifecycle faults are back. hung-peer (a prefill
# process stopped past decode's deadline, then killed) was left out at first: a receive on the
# direct path from the hung sender stayed with UCX after the sender's loss and was poisoned, a
# breach in 5 of 6 such 60 s runs; native now empties the dead peer's sysv FIFO, which UCX's
# discard of the endpoint waited on (docs/stress.md, "The hung peer"). `make soak` runs every
# fault (its default, all).
SOAK_CI_PROCESS_FAULTS ?= cancel,deadline,freeze,lost-peer,partition,restart,dead-peer,freeze-paths,hung-peer

soak: soak-build ## 30-minute fault soak; prints the summary tables, exits non-zero on any breach.
	@rc=0; \
	$(SOAK_BIN) --duration 15m $(SOAK_FLAGS) || rc=1; \
	$(SOAK_BIN) --processes --duration 15m $(SOAK_FLAGS) || rc=1; \
	exit $$rc
