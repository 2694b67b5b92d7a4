# SPDX-License-Identifier: Apache-2.0
# Layer-wise streaming (issue 9): the exposed-vs-plain measurement joins `make bench`. Its tests
# run in go-test with the rest of ./transfer and ./internal/streambench.
MICROBENCH_TARGETS += bench-stream
.PHONY: bench-stream

bench-stream: ## Streamed transfer beside simulated prefill: exposed_us, plain_us, exposed_ratio (Llama-3-8B, 4096 tokens; in-memory and UCX).
	$(GO) test -run '^$$' -bench Stream -benchtime 1x -v ./internal/streambench/
