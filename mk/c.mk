# SPDX-License-Identifier: Apache-2.0
# C: the host gather/scatter and the UCX layer of native/, built by CMake (CMakeLists.txt,
# native/CMakeLists.txt) with AddressSanitizer and UndefinedBehaviorSanitizer (L7), and their
# tests under ctest. cgo compiles the same sources for Go.
.PHONY: c-test

c-test: ## C tests (ctest) built with AddressSanitizer and UndefinedBehaviorSanitizer.
	cmake -S . -B $(UCX_BUILD)/asan -DCMAKE_BUILD_TYPE=Debug -DKVX_SANITIZE=ON $(C_CMAKE_FLAGS) >/dev/null
	cmake --build $(UCX_BUILD)/asan -j2
	cd $(UCX_BUILD)/asan && ctest --output-on-failure --timeout 300
