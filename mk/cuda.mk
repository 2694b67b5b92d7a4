# SPDX-License-Identifier: Apache-2.0
# CUDA targets: the kernel compile check that `make test` runs on every host, and the GPU CI job.
#
#   cuda-check  compile the kernels for sm_80 and sm_90 (nvcc from the system, else the pinned
#               PyPI wheels that scripts/cuda-toolchain.sh caches in .toolchain/), print ptxas'
#               register and spill report per kernel, fail on a compile error or any spill;
#               also build build/cuda/libkvxcuda.so, which the Go tests load without a GPU.
#   cuda-vet    go vet with the gpu build tag, so the GPU-only tests (cuda/, and the device
#               transfer's in native/ and transfer/) always compile.
#   gpu-test    the GPU CI job; see docs/cuda.md and docs/ucx.md ("Device memory").
.PHONY: cuda-check cuda-lib cuda-vet gpu-test

CUDA_ARCHS := 80 90
CUDA_CHECK_DIR := $(BUILD)/cuda-check
CUDA_SOURCES := cuda/kvx_cuda.cu cuda/kvx_cuda.h include/kvx/kvx_layout.h
CUDA_NVCC_FLAGS := -std=c++17 -O3 -Icuda -Iinclude --Werror all-warnings -Xptxas -v

TEST_TARGETS += cuda-check cuda-vet

# The Go tests load the real libcudart and libkvxcuda.so (no GPU needed), so build them first,
# and make a missing library a failure there rather than a skip.
go-test: cuda-lib
go-test: export KVX_REQUIRE_CUDA_LIBS := 1

# One ptxas log per architecture, rebuilt only when a source changes, so a repeat `make test`
# prints the report from the log instead of recompiling.
$(CUDA_CHECK_DIR)/ptxas.sm_%.log: $(CUDA_SOURCES) scripts/cuda-toolchain.sh
	@mkdir -p $(CUDA_CHECK_DIR)
	@root=$$(scripts/cuda-toolchain.sh); \
	echo "cuda-check: $$root/bin/nvcc -arch=sm_$* -cubin cuda/kvx_cuda.cu"; \
	"$$root/bin/nvcc" $(CUDA_NVCC_FLAGS) -arch=sm_$* -cubin -o $(CUDA_CHECK_DIR)/kvx_cuda.sm_$*.cubin \
		cuda/kvx_cuda.cu > $@.tmp 2>&1 || { cat $@.tmp; rm -f $@.tmp; echo "cuda-check: FAILED: kernels do not compile for sm_$*"; exit 1; }
	@mv $@.tmp $@

cuda-check: $(foreach a,$(CUDA_ARCHS),$(CUDA_CHECK_DIR)/ptxas.sm_$(a).log) cuda-lib ## Compile the kernels for sm_80/sm_90, print ptxas registers/spills per kernel, fail on spills.
	@status=0; for a in $(CUDA_ARCHS); do \
		awk -v arch=sm_$$a ' \
			/Compiling entry function/ { name = $$0; sub(/.*function \047/, "", name); sub(/\047.*/, "", name); next } \
			/spill stores/ { split($$0, f, ","); stores = f[2] + 0; loads = f[3] + 0; next } \
			/Used [0-9]+ registers/ { regs = $$0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs); n++; \
				printf "%s %s\n      registers %3d  spill stores %d  spill loads %d%s\n", arch, name, regs, \
					stores, loads, (stores + loads > 0 ? "  <-- SPILLS" : ""); \
				if (stores + loads > 0) bad++ } \
			END { if (n == 0) { print "cuda-check: no kernels in the ptxas report for " arch; exit 2 } \
				if (bad) { printf "cuda-check: %d kernel(s) spill registers on %s\n", bad, arch; exit 1 } }' \
			$(CUDA_CHECK_DIR)/ptxas.sm_$$a.log | { command -v c++filt >/dev/null && c++filt || cat; } || status=1; \
	done; \
	if [ $$status -ne 0 ]; then echo "cuda-check: FAILED (register spills are a defect: see above)"; exit 1; fi; \
	echo "cuda-check: kernels compile for $(foreach a,$(CUDA_ARCHS),sm_$(a)) without spills"

# libkvxcuda.so for the Go tests on this host, built by cuda/CMakeLists.txt with the same nvcc.
cuda-lib:
	@root=$$(scripts/cuda-toolchain.sh); \
	cmake -S cuda -B $(BUILD)/cuda -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$$root/bin/nvcc" \
		-DCUDAToolkit_ROOT="$$root" "-DCMAKE_CUDA_ARCHITECTURES=80-real;90" >/dev/null && \
	cmake --build $(BUILD)/cuda -j2 > $(BUILD)/cuda/build.log 2>&1 || { cat $(BUILD)/cuda/build.log; exit 1; }

cuda-vet:
	$(GO) vet -tags gpu ./cuda/... ./native/ ./transfer/ ./cmd/kvxbench/

# The GPU CI job. It refuses to run (non-zero, one clear line) on a host without an NVIDIA GPU,
# builds libkvxcuda.so with the system's nvcc for this GPU, runs the gpu-tagged tests, then the
# device bandwidth benchmark against cudaMemcpy device-to-device. Then the device transfer
# (gpu-test-ucx): native/, transfer/ and kvxbench built against the CUDA-enabled UCX of the
# libucx-cu12 wheel (scripts/ucx-cuda.sh, mk/ucxcuda.mk), the device transfer tests, and
# `kvxbench run --memory device`: two processes on this GPU, pools and staging slots in device
# memory, GPU_PROMPTS through the engine, every byte checked, beside `ucx_perftest -m cuda`. A
# failing test does not stop the run (GPU time is scarce: one session should show both); the
# target still fails at the end.
GPU_BUILD := $(BUILD)/gpu
GPU_BENCHTIME ?= 20x
GPU_PROMPTS ?= 1k,4k,16k
GPU_RUN_FLAGS ?=
.PHONY: gpu-test-ucx
gpu-test: ## GPU CI job: kernels (gpu-tagged tests, device bandwidth benchmark), then the two-process device transfer over UCX (gpu-test-ucx).
	@if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep '^GPU ' >/dev/null; then \
		echo "gpu-test: no NVIDIA GPU on this host (nvidia-smi missing or lists no GPU); run this job on a GPU runner" >&2; \
		exit 1; \
	fi
	@nvidia-smi -L
	@root=$$(scripts/cuda-toolchain.sh); \
	case "$$root" in */.toolchain/*) echo "gpu-test: no system CUDA toolkit; building with the PyPI nvcc at $$root" >&2;; esac; \
	cmake -S cuda -B $(GPU_BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$$root/bin/nvcc" \
		-DCUDAToolkit_ROOT="$$root" -DCMAKE_CUDA_ARCHITECTURES=native >/dev/null
	cmake --build $(GPU_BUILD) -j
	@root=$$(scripts/cuda-toolchain.sh); \
	cudart=$$(ls "$$root"/lib64/libcudart.so.[0-9]* "$$root"/lib/libcudart.so.[0-9]* 2>/dev/null | sort | sed -n 1p); \
	[ -n "$$cudart" ] || { echo "gpu-test: no libcudart.so.N under $$root" >&2; exit 1; }; \
	export KVX_CUDA_LIB=$(abspath $(GPU_BUILD))/libkvxcuda.so KVX_CUDART="$$cudart"; \
	echo "gpu-test: KVX_CUDA_LIB=$$KVX_CUDA_LIB KVX_CUDART=$$KVX_CUDART"; \
	$(GO) test -tags gpu -race -count=1 -timeout 10m -v ./cuda/... && \
	$(GO) test -tags gpu -count=1 -timeout 10m -run '^$$' -bench . -benchtime $(GPU_BENCHTIME) ./cuda/
	@$(MAKE) --no-print-directory gpu-test-ucx

# The device transfer over UCX, on the libkvxcuda.so gpu-test built. Run alone it needs that
# build ($(GPU_BUILD)/libkvxcuda.so) first.
gpu-test-ucx: ## Device transfer over the libucx-cu12 UCX: device tests, kvxbench run --memory device beside ucx_perftest -m cuda (after gpu-test's build).
	@[ -f $(GPU_BUILD)/libkvxcuda.so ] || { echo "gpu-test-ucx: no $(GPU_BUILD)/libkvxcuda.so; run make gpu-test" >&2; exit 1; }
	@$(ucx_cuda_env); \
	cuda=$$(scripts/cuda-toolchain.sh); \
	cudart=$$(ls "$$cuda"/lib64/libcudart.so.[0-9]* "$$cuda"/lib/libcudart.so.[0-9]* 2>/dev/null | sort | sed -n 1p); \
	export KVX_CUDA_LIB=$(abspath $(GPU_BUILD))/libkvxcuda.so KVX_CUDART="$$cudart" KVX_EXPECT_UCX_CUDA=1 KVX_EXPECT_UCX_VERSION=1.22; \
	echo "gpu-test-ucx: UCX $$(pkg-config --modversion ucx) from $$root; ucx_info sees:"; \
	ucx_info -d | grep -E 'Transport: (cuda|posix|cma|tcp)' | sort | uniq -c || true; \
	rc=0; $(GO) test -tags gpu -race -count=1 -timeout 10m -v -run 'MemoryType|DeviceMemory|UCXDevice|UCXRegion_Device' ./native/ ./transfer/ || rc=1; \
	$(GO) build -o $(GPU_BUILD)/kvxbench ./cmd/kvxbench; \
	echo "gpu-test-ucx: which UCX protocols carry device memory (UCX_PROTO_INFO=y, one short run, $(GPU_BUILD)/device-proto.log):"; \
	UCX_PROTO_INFO=y $(GPU_BUILD)/kvxbench run --memory device --prompts 1k --concurrency 1 --duration 100ms --baseline=false \
		> $(GPU_BUILD)/device-proto.log 2>&1 || echo "gpu-test-ucx: the short run failed; see $(GPU_BUILD)/device-proto.log"; \
	grep -iE 'cuda|rendezvous|eager' $(GPU_BUILD)/device-proto.log | sort | uniq | head -n 40 || true; \
	echo "gpu-test-ucx: $(GPU_BUILD)/kvxbench run --memory device --prompts $(GPU_PROMPTS) --concurrency 1 --json $(GPU_RUN_FLAGS)"; \
	$(GPU_BUILD)/kvxbench run --memory device --prompts $(GPU_PROMPTS) --concurrency 1 --json $(GPU_RUN_FLAGS) | tee $(GPU_BUILD)/device-run.json || rc=1; \
	echo "gpu-test-ucx: figures in $(GPU_BUILD)/device-run.json (record them in docs/gpu-results.md)"; \
	[ $$rc = 0 ] || { echo "gpu-test-ucx: FAILED (see above: the device tests and the run both ran, so one GPU session shows both)"; exit 1; }
