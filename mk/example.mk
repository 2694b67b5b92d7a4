# SPDX-License-Identifier: Apache-2.0
# examples/disagg over UCX (owned by the example work). Its tests run in go-test with
# everything else; `make disagg` (mk/serving.mk) is the in-memory, one-process run.
.PHONY: disagg-ucx

disagg-ucx: deps ## Run the prefill/decode example over UCX: two processes, ContextParams over HTTP on 127.0.0.1.
	$(GO) run ./examples/disagg -transport=ucx
