# SPDX-License-Identifier: Apache-2.0
# The direct path's RMA mode (docs/onecopy.md): the 4k-token request over shared memory, RMA
# gets then IOV messages (--no-rma), three alternating pairs, each beside ucx_perftest. The
# host is noisy, so the pairs alternate and every ratio is printed. Included by the Makefile.

MICROBENCH_TARGETS += bench-rma
.PHONY: bench-rma

bench-rma: kvxbench ## kvxbench run of the 4k-token request over shared memory: RMA mode, then --no-rma, three times (ratio of each).
	@for i in 1 2 3; do \
		$(KVXBENCH) run --json --tls posix,cma,self --prompts 4k --concurrency 1 --duration 3s $(KVXBENCH_FLAGS) || exit 1; \
		$(KVXBENCH) run --json --tls posix,cma,self --prompts 4k --concurrency 1 --duration 3s --no-rma $(KVXBENCH_FLAGS) || exit 1; \
	done
