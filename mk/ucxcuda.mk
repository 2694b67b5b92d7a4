# SPDX-License-Identifier: Apache-2.0
# A CUDA-enabled UCX (the libucx-cu12 wheel, pinned in scripts/ucx-cuda.sh) beside Debian's.
#
#   ucx-cuda-check  no GPU needed: build native/, transfer/ and kvxbench against the wheel's
#                   UCX 1.22, run host-memory UCX tests with it (API and ABI compatibility with
#                   a newer UCX than Debian's 1.13; the gpu-tagged tests are vetted against its
#                   headers too), check that this UCX reports CUDA memory
#                   exactly when a driver is present, and that `kvxbench run --memory device`
#                   stops in one line, non-zero, on a host without a GPU.
#
# Part of `make test`: the device path is built against this UCX on GPU hosts, so drifting away
# from it must fail here, on every host. It costs about 20 s after a change to native/ (it
# compiles native/, transfer/ and kvxbench a second time, against the other UCX) and 7 s when
# nothing changed, and fetches the 45 MB wheel from PyPI once, as cuda-check fetches nvcc.
# `make gpu-test` (mk/cuda.mk) builds the same way and runs the device transfer.
TEST_TARGETS += ucx-cuda-check
.PHONY: ucx-cuda-check

UCX_CUDA_BUILD := $(BUILD)/ucx-cuda

# The host-memory tests run against UCX 1.22. Three are left out, because their premise (an
# 8 MiB send nobody receives stays in flight) does not hold there: with 1.22 and kvxfer's
# UCX_RNDV_SCHEME=get_zcopy default, shm and tcp offer no get_zcopy lane, so UCX sends large
# messages as multi-fragment eager instead of rendezvous, and such a send completes at once
# (native.TestUCX_ForceCloseCompletesInflightSend, transfer.TestUCXTransport_ContractCancel and
# ContractForceCloseReportsEveryOp fail on it; docs/ucx.md, "UCX 1.22").
UCX_CUDA_NATIVE_TESTS := StatusCodes|LoopbackUsesSharedMemory|TaggedTransfersEveryByte|ManySmallMessages|RMAPutGet|CancelUnmatched|TestL6_|TestL2_|InvalidRanges|MemoryType|DeviceMemory|RegisterRefuses|DeviceOps|RunOnThread
UCX_CUDA_TRANSFER_TESTS := TestUCXTransport_Contract(ControlAndData|RefusesGoMemory|RefusesCollidingReceives)|TestUCXTransport_TwoEnginesEveryByteChecked|TestUCXDirect_EveryByteAcrossLayouts|TestUCXDevice_|TestUCXRegion_

# ucx_cuda_env (a shell snippet) builds against the wheel's UCX and runs against it: pkg-config
# finds its headers and libraries, the rpath makes the binaries load it rather than Debian's.
define ucx_cuda_env
root=$$(scripts/ucx-cuda.sh); \
export PKG_CONFIG_PATH="$$root/lib/pkgconfig" CGO_LDFLAGS="-Wl,-rpath,$$root/lib $${CGO_LDFLAGS:-}"; \
export PATH="$$root/bin:$$PATH" LD_LIBRARY_PATH="$$root/lib$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}"
endef

ucx-cuda-check: ## Build native/, transfer/, kvxbench against UCX 1.22 (libucx-cu12 wheel) and run host-memory UCX tests with it.
	@$(ucx_cuda_env); \
	mkdir -p $(UCX_CUDA_BUILD); \
	echo "ucx-cuda-check: building against $$(pkg-config --modversion ucx) at $$root"; \
	$(GO) test -c -o $(UCX_CUDA_BUILD)/native.test ./native; \
	$(GO) test -c -o $(UCX_CUDA_BUILD)/transfer.test ./transfer; \
	$(GO) build -o $(UCX_CUDA_BUILD)/kvxbench ./cmd/kvxbench; \
	$(GO) vet -tags gpu ./native/ ./transfer/ ./cmd/kvxbench/; \
	for b in native.test transfer.test kvxbench; do \
		ldd $(UCX_CUDA_BUILD)/$$b | grep -F "$$root/lib/libucp.so" >/dev/null || \
			{ echo "ucx-cuda-check: $$b does not load $$root/lib/libucp.so"; ldd $(UCX_CUDA_BUILD)/$$b | grep uc; exit 1; }; \
	done; \
	gpu=0; if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep '^GPU ' >/dev/null; then gpu=1; fi; \
	export KVX_EXPECT_UCX_CUDA=$$gpu KVX_EXPECT_UCX_VERSION=1.22; \
	echo "ucx-cuda-check: host-memory UCX tests against UCX 1.22 (CUDA memory expected: $$gpu)"; \
	(cd native && ../$(UCX_CUDA_BUILD)/native.test -test.count=1 -test.timeout 5m -test.run '$(UCX_CUDA_NATIVE_TESTS)' 2>&1 | grep -v 'was not returned to mpool') ; \
	(cd transfer && ../$(UCX_CUDA_BUILD)/transfer.test -test.count=1 -test.timeout 5m -test.run '$(UCX_CUDA_TRANSFER_TESTS)' 2>&1 | grep -v 'was not returned to mpool'); \
	if [ $$gpu = 0 ]; then \
		out=$$($(UCX_CUDA_BUILD)/kvxbench run --memory device --prompts 1k --concurrency 1 2>&1) && \
			{ echo "ucx-cuda-check: kvxbench run --memory device succeeded on a host without a GPU: $$out"; exit 1; }; \
		[ "$$(printf '%s\n' "$$out" | wc -l)" = 1 ] && case "$$out" in "kvxbench: --memory device: "*) true;; *) false;; esac || \
			{ echo "ucx-cuda-check: expected one line 'kvxbench: --memory device: ...', got:"; echo "$$out"; exit 1; }; \
		echo "ucx-cuda-check: kvxbench run --memory device without a GPU: $$out"; \
	fi; \
	echo "ucx-cuda-check: OK (UCX $$(pkg-config --modversion ucx))"
