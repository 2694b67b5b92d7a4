# SPDX-License-Identifier: Apache-2.0
# The one-copy (direct) path: the 4k-token request both ways, direct then staging, each beside
# ucx_perftest at its own message size. Included by the Makefile after its defaults.

MICROBENCH_TARGETS += bench-onecopy
.PHONY: bench-onecopy

bench-onecopy: kvxbench ## kvxbench run of the 4k-token request over shared memory: direct path, then --staging (ratio of each).
	$(KVXBENCH) run --tls posix,cma,self --prompts 4k --concurrency 1 $(KVXBENCH_FLAGS)
	$(KVXBENCH) run --tls posix,cma,self --prompts 4k --concurrency 1 --staging $(KVXBENCH_FLAGS)
