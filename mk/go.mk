# SPDX-License-Identifier: Apache-2.0
# Go: tidiness, vet, the tests under -race, the fuzz targets, and the disagg example.
# go-test first builds libkvxcuda.so (mk/cuda.mk), whose loading the cuda tests check.
.PHONY: go-tidy go-vet go-nocgo go-imports api-surface go-test go-fuzz fuzz-ucx-address fuzz-ucx-rkey serving-test pair disagg disagg-ucx

# Fuzz targets run for FUZZ_TIME each in `make test`, as package:FuzzName: the layout plans,
# the wire decoder and ContextParams, kvxfer's own parsers, and a peer's remote key (refused by
# native.CheckRemoteKey or unpacked, and every byte it names read, in a child process).
# FUZZ_MINIMIZE_TIME bounds the minimizing of each new input: FuzzRemoteKey reruns a child
# process for every try.
FUZZ_TARGETS := ./internal/kvplan:FuzzPlan ./transfer/internal/wire:FuzzDecode ./transfer/transport/ucx:FuzzContextParams ./native:FuzzRemoteKey
FUZZ_TIME ?= 10s
FUZZ_MINIMIZE_TIME ?= 10s
# A peer's worker address (refused by native.CheckAddress or survived by UCX, tried in a child
# process) is fuzzed by `make fuzz-ucx-address`, not in `make test`: what it finds are UCX 1.13
# asserts on crafted addresses (UCX trusts every byte), each one then refused by CheckAddress and
# kept as a seed. Its seeds run in go-test as plain tests on every `make test`.
FUZZ_ADDRESS_TIME ?= 5m
# The remote key fuzzer's long run, as the address fuzzer's (make test runs it for FUZZ_TIME).
FUZZ_RKEY_TIME ?= 5m

# go.mod and go.sum must be what `go mod tidy` makes: direct requirements marked as such, none
# missing or left over. `-diff` changes nothing and fails, printing the diff, when they are not.
go-tidy: ## go.mod and go.sum are what `go mod tidy` makes (prints the diff when not).
	$(GO) mod tidy -diff

go-vet: ## go vet of every package.
	$(GO) vet ./...

# A build without cgo has no UCX transport (and no C copy, no NVML) but must still build and
# vet: the engine over the mem transport, the registry, the probes, and commands that say why
# a UCX run cannot start. Nothing else builds the tree this way, and it had broken unnoticed.
go-nocgo: ## Every package builds and vets with CGO_ENABLED=0 (no UCX, no C copy).
	CGO_ENABLED=0 $(GO) build ./...
	CGO_ENABLED=0 $(GO) vet ./...

# The import rules, a table in internal/importcheck: imports point down the floors (layout,
# cuda and native, buffer, transfer, then internal, cmd, examples), only native/ imports "C",
# only cuda/ imports purego. One line per offending import.
go-imports: ## Imports point down (native never imports transfer); "C" only in native/, purego only in cuda/.
	$(GO) test -count=1 -run '^TestRepository_ImportsPointDown$$' ./internal/importcheck/

# Each public package's exported identifiers (as `go doc -all` lists them) within its budget in
# internal/apisurface.Budgets; -v prints the table. Part of go-test too.
api-surface: ## Exported identifiers per public package, against their budgets (internal/apisurface).
	$(GO) test -count=1 -v -run '^TestRepository_APISurface$$' ./internal/apisurface/

# The packages go-test starts first. `go test` runs two test binaries at a time on two cores, in
# the order of its package list, so ./... alone starts the transfer package (the longest by far,
# about 7 minutes, and mostly waiting on peers and deadlines) only after native, stress and the
# rest had their turn: 4.5 minutes into a cold run. Listed first, it starts as soon as it is
# built and the other packages run beside it.
GO_TEST_FIRST ?= ./transfer

go-test: ## Every Go test with -race (two-process and UCX tests included).
	$(GO) test -race -count=1 -timeout 35m $(GO_TEST_FLAGS) $(GO_TEST_FIRST) ./...

go-fuzz: ## Run every fuzz target for FUZZ_TIME (default 10s).
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} in $${t%%:*} for $(FUZZ_TIME)"; \
		scripts/fuzz.sh $(GO) "$${t%%:*}" "$${t#*:}" $(FUZZ_TIME) $(FUZZ_MINIMIZE_TIME) || exit 1; \
	done

fuzz-ucx-address: ## Fuzz native.CheckAddress against this host's UCX for FUZZ_ADDRESS_TIME (default 5m).
	scripts/fuzz.sh $(GO) ./native FuzzWorkerAddress $(FUZZ_ADDRESS_TIME)

fuzz-ucx-rkey: ## Fuzz native.CheckRemoteKey against this host's UCX for FUZZ_RKEY_TIME (default 5m).
	scripts/fuzz.sh $(GO) ./native FuzzRemoteKey $(FUZZ_RKEY_TIME) $(FUZZ_MINIMIZE_TIME)

# Serving integration (transfer/observe, examples/pair, examples/disagg). Their tests run in
# go-test with everything else; these targets run them alone.
serving-test: ## Metrics, /healthz handler, logs and the examples (pair, disagg), with -race.
	$(GO) test -race -count=1 ./transfer/observe/ ./examples/...

pair: deps ## Run examples/pair: a prefill/decode pair in 150 lines, two processes over UCX shared memory.
	$(GO) run ./examples/pair

disagg: ## Run the prefill/decode example (both roles in one process, in-memory transport).
	$(GO) run ./examples/disagg -transport=mem

disagg-ucx: deps ## Run the prefill/decode example over UCX: two processes, ContextParams over HTTP on 127.0.0.1.
	$(GO) run ./examples/disagg -transport=ucx

# The hostile peer harness (internal/hostile, docs/security.md "The hostile peer harness"): a
# lying peer process over real UCX against an engine with canaries around its pools, for
# HOSTILE_TIME in all (shared memory with a cluster key, then TCP on loopback without one),
# bounded by HOSTILE_TIMEOUT. make test runs three rounds of each in go-test.
HOSTILE_TIME ?= 10m
HOSTILE_TIMEOUT ?= 30m
.PHONY: hostile
hostile: ## Hostile peer harness for HOSTILE_TIME (default 10m): every forgery refused and counted, no canary byte changed.
	KVX_HOSTILE_DURATION=$(HOSTILE_TIME) $(GO) test -count=1 -v -timeout $(HOSTILE_TIMEOUT) \
		-run '^TestHostilePeer_EveryForgeryRefused$$' ./internal/hostile/
