# SPDX-License-Identifier: Apache-2.0
# Serving integration (transfer/observe, examples/disagg): owned by the serving work.
# Their tests run in go-test with everything else; these targets run them alone.

MICROBENCH_TARGETS += bench-observe
.PHONY: serving-test disagg bench-observe

serving-test: ## Metrics, /healthz handler, logs and the disagg example, with -race.
	$(GO) test -race -count=1 ./transfer/observe/ ./examples/...

disagg: ## Run the prefill/decode example (both roles in one process, in-memory transport).
	$(GO) run ./examples/disagg -transport=mem

bench-observe: ## Observer cost per transfer and the cost of one /metrics scrape.
	$(GO) test -run '^$$' -bench 'Metrics_Transfer|Handler_Scrape' -benchtime 2s ./transfer/observe/
