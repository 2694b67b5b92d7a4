# SPDX-License-Identifier: Apache-2.0
# The transfer lifecycle (issue 4): its wire fuzz target joins `make test`, its benchmarks
# `make bench`.
FUZZ_TARGETS += ./transfer:FuzzDecode
MICROBENCH_TARGETS += bench-lifecycle
.PHONY: bench-lifecycle

bench-lifecycle: ## Engine benchmarks: Status, Cancel, and throughput with 10 vs 10,000 transfers in flight.
	$(GO) test -run '^$$' -bench 'Status|Cancel|ManyInFlight' -benchtime 2s ./transfer/
