# SPDX-License-Identifier: Apache-2.0
# CUDA: the kernel compile check that `make test` runs on every host, and the GPU CI job.
#
#   cuda-check    compile the kernels for sm_80 and sm_90 (nvcc from the system, else the pinned
#                 PyPI wheels that scripts/cuda-toolchain.sh caches in .toolchain/), print
#                 ptxas' register and spill report per kernel, fail on a compile error or any
#                 spill (scripts/cuda-check.sh); also build build/cuda/libkvxcuda.so, which the
#                 Go tests load without a GPU.
#   cuda-vet      go vet with the gpu build tag, so the GPU-only tests (cuda/, and the device
#                 transfer's in native/ and transfer/) always compile.
#   gpu-test      the GPU CI job (scripts/gpu-test.sh, then gpu-test-ucx); see docs/cuda.md and
#                 docs/ucx.md ("Device memory").
#   gpu-bundle    the same checks for a GPU machine with no Go and no UCX: build them here
#                 (scripts/gpu-bundle.sh) into one archive that scripts/gpu-run.sh runs there;
#                 gpu-bundle-rehearse runs it here, where it must stop at "no GPU"
#                 (docs/gpu-results.md, "Running the bundle").
.PHONY: cuda-check cuda-lib cuda-vet gpu-test gpu-test-ucx gpu-bundle gpu-bundle-rehearse

CUDA_ARCHS := 80 90
CUDA_CHECK_DIR := $(BUILD)/cuda-check
CUDA_SOURCES := cuda/kvx_cuda.cu cuda/kvx_cuda.h include/kvx/kvx_layout.h

# The Go tests load the real libcudart and libkvxcuda.so (no GPU needed), so build them first,
# and make a missing library a failure there rather than a skip.
go-test: cuda-lib
go-test: export KVX_REQUIRE_CUDA_LIBS := 1

# One ptxas log per architecture, rebuilt only when a source changes, so a repeat `make test`
# prints the report from the log instead of recompiling.
$(CUDA_CHECK_DIR)/ptxas.sm_%.log: $(CUDA_SOURCES) scripts/cuda-toolchain.sh scripts/cuda-check.sh
	@scripts/cuda-check.sh compile $* $@

cuda-check: $(foreach a,$(CUDA_ARCHS),$(CUDA_CHECK_DIR)/ptxas.sm_$(a).log) cuda-lib ## Compile the kernels for sm_80/sm_90, print ptxas registers/spills per kernel, fail on spills.
	@scripts/cuda-check.sh report $(foreach a,$(CUDA_ARCHS),$(CUDA_CHECK_DIR)/ptxas.sm_$(a).log)

# libkvxcuda.so for the Go tests on this host, built by cuda/CMakeLists.txt with the same nvcc.
cuda-lib: ## Build $(BUILD)/cuda/libkvxcuda.so with the nvcc of scripts/cuda-toolchain.sh.
	@root=$$(scripts/cuda-toolchain.sh); \
	cmake -S cuda -B $(BUILD)/cuda -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$$root/bin/nvcc" \
		-DCUDAToolkit_ROOT="$$root" "-DCMAKE_CUDA_ARCHITECTURES=80-real;90" >/dev/null && \
	cmake --build $(BUILD)/cuda -j2 > $(BUILD)/cuda/build.log 2>&1 || { cat $(BUILD)/cuda/build.log; exit 1; }

cuda-vet: ## go vet with the gpu build tag, so the GPU-only tests always compile.
	$(GO) vet -tags gpu ./cuda/... ./native/ ./transfer/... ./cmd/kvxbench/ ./internal/bench/...

# The GPU CI job. It refuses to run (non-zero, one clear line) on a host without an NVIDIA GPU,
# builds libkvxcuda.so with the system's nvcc for this GPU, runs the gpu-tagged tests, then the
# device bandwidth benchmark against cudaMemcpy device-to-device (scripts/gpu-test.sh). Then the
# device transfer, gpu-test-ucx (scripts/gpu-test-ucx.sh): native/, transfer/ and kvxbench
# built against the CUDA-enabled UCX of the libucx-cu12 wheel (scripts/ucx-cuda.sh), the device
# transfer tests, and `kvxbench run --memory device` on GPU_PROMPTS beside
# `ucx_perftest -m cuda`; a failing test does not stop that run, the target still fails at the
# end. Run alone, gpu-test-ucx needs gpu-test's build ($(GPU_BUILD)/libkvxcuda.so) first.
GPU_BUILD := $(BUILD)/gpu
GPU_BENCHTIME ?= 20x
GPU_PROMPTS ?= 1k,4k,16k
GPU_RUN_FLAGS ?=

gpu-test: ## GPU CI job: kernels (gpu-tagged tests, device bandwidth benchmark), then the two-process device transfer over UCX (gpu-test-ucx).
	@GO=$(GO) scripts/gpu-test.sh $(GPU_BUILD) $(GPU_BENCHTIME)
	@$(MAKE) --no-print-directory gpu-test-ucx

gpu-test-ucx: ## Device transfer over the libucx-cu12 UCX: device tests, kvxbench run --memory device beside ucx_perftest -m cuda (after gpu-test's build).
	@GO=$(GO) scripts/gpu-test-ucx.sh $(GPU_BUILD) '$(GPU_PROMPTS)' '$(GPU_RUN_FLAGS)'

# The GPU bundle, for a GPU machine that has the driver but no Go, no UCX and no registry: the
# gpu-tagged test binaries, the two-process tests' peers, kvxbench, libkvxcuda.so (sm_80, sm_90),
# libcudart and the wheel's UCX with ucx_perftest, in one .tar.xz well under the 64 MiB the
# device tool carries. `bash scripts/gpu-run.sh $(GPU_BUNDLE)` runs it there. The rehearsal is
# not in `make test`: it relinks five -race test binaries and three more against the other UCX
# and runs the preflight, 7 to 9 minutes on a loaded 2-core box (docs/gpu-results.md).
GPU_BUNDLE := $(BUILD)/gpu-bundle.tar.xz

gpu-bundle: cuda-lib ## Build $(BUILD)/gpu-bundle.tar.xz: test binaries, peers, kvxbench, libkvxcuda.so, UCX for scripts/gpu-run.sh (no GPU needed).
	@GO=$(GO) scripts/gpu-bundle.sh $(BUILD)/gpu-bundle $(GPU_BUNDLE)

gpu-bundle-rehearse: gpu-bundle ## Build the GPU bundle and run scripts/gpu-run.sh on it here: no GPU means exit 3 after a complete preflight.
	@scripts/gpu-rehearse.sh $(GPU_BUNDLE) $(BUILD)/gpu-rehearsal
