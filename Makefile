# Thin wrappers over cargo and scripts/. Every target installs what it needs first and is
# quick when everything is already there.

SHELL := /bin/bash
export CARGO_TARGET_DIR ?= $(HOME)/.cache/recollect/target
BIN := $(CARGO_TARGET_DIR)/debug/recollect
# What the speed figures are measured on: the binary users deploy (the image builds --release).
RELEASE_BIN := $(CARGO_TARGET_DIR)/release/recollect
LOCOMO ?= ../shared/data/locomo-dev.json
# One profile (dev: our crates at opt-level 1, dependencies at 3; see Cargo.toml) for run, test
# and eval, so a cold machine compiles the dependencies once. `make bench` and `make bench-peers`
# time the release build instead: the dev profile's ingest took 0.34 ms of CPU a turn at 10k
# where release took 0.25 (2026-11-29), so it would time our own code, not what runs. Their
# first run compiles the release profile once (~16 min on 2 cores).
CARGO_FLAGS := --locked

.PHONY: setup setup-crates setup-test install build build-release run test lint fmt eval eval-ablations bench bench-peers bench-micro e2e-kafka check-deploy fuzz clients test-clients

setup:
	@bash scripts/setup.sh

# The patched dependencies alone (vendor/): what cargo needs to resolve the workspace at all.
setup-crates:
	@bash scripts/setup-crates.sh

# What `make test` needs beyond serving: the broker, graph and vector servers, deploy tools.
setup-test:
	@bash scripts/setup.sh --test

# `recollect` on PATH (PREFIX/bin, default ~/.local/bin): the binary `make run` built. It finds
# the model in ~/.cache/recollect/models, so `recollect mcp` works from any directory.
PREFIX ?= $(HOME)/.local
install: build
	install -D -m 755 $(BIN) $(PREFIX)/bin/recollect
	@echo "installed $(PREFIX)/bin/recollect"

build: setup
	cargo build $(CARGO_FLAGS) -p recollect

build-release: setup
	cargo build $(CARGO_FLAGS) --release -p recollect

run: build
	$(BIN) serve

test: setup-test
	bash scripts/test.sh

# The distributed pipeline alone: tansu + every service as a process (tests/tests/kafka_e2e.rs).
# E2E_EMBEDDER=minilm measures with the local model instead of the hash embedder.
E2E_EMBEDDER ?= hash
e2e-kafka: setup-test
	cargo build $(CARGO_FLAGS) --workspace --all-targets
	@# The test binary itself: `cargo test --test NAME` would resolve features differently and
	@# rebuild the big dependencies.
	RECOLLECT_TANSU=$$(bash scripts/setup-kafka.sh | tail -1) REQUIRE_KAFKA=1 RECOLLECT_E2E_EMBEDDER=$(E2E_EMBEDDER) \
	RECOLLECT_MODEL_DIR=$${RECOLLECT_MODEL_DIR:-$(CURDIR)/models/all-MiniLM-L6-v2} \
	$$(ls -t $(CARGO_TARGET_DIR)/debug/deps/kafka_e2e-* | grep -v '\.d$$' | head -1) --nocapture

# Only the deploy artefacts (also part of `make test`): no Rust build.
check-deploy: setup-test
	$${RECOLLECT_VENV:-$$HOME/.cache/recollect/venv}/bin/python scripts/check-deploy.py --self-test

# The SDKs' generated types (clients/python: pydantic models; clients/typescript: schema.ts) from
# the committed snapshot clients/openapi.json. Refresh the snapshot from a running server first
# with `python3 scripts/check-clients-drift.py --url URL --update`.
clients:
	bash scripts/gen-clients.sh

# The Python and TypeScript clients against live servers (the built binary): sync, async, error
# paths and retries, LangChain, LlamaIndex; the generated code and the snapshot checked for drift.
test-clients: build
	bash scripts/test-clients.sh

lint: setup-crates
	cargo fmt --all -- --check
	cargo clippy $(CARGO_FLAGS) --workspace --all-targets -- -D warnings

fmt: setup-crates
	cargo fmt --all

# Figures as JSON and plots (SVG) land in REPORTS beside the printed tables.
REPORTS ?= reports
# EVAL_BASELINE=FILE: an earlier run's rankings (e.g. a copy of the last locomo-rankings.json);
# each figure is then also printed as a paired difference from it, with its 95% interval.
EVAL_BASELINE ?=
eval: build
	@if [ -f "$(LOCOMO)" ]; then mkdir -p $(REPORTS) && \
	$(BIN) eval locomo --data $(LOCOMO) --dump-rankings $(CARGO_TARGET_DIR)/locomo-rankings.json --json $(REPORTS)/eval.json $(if $(EVAL_BASELINE),--baseline $(EVAL_BASELINE)) && \
	bash scripts/plot.sh eval $(REPORTS)/eval.json $(REPORTS)/eval-recall-at-k.svg; \
	else echo "skipping eval: $(LOCOMO) not found (LoCoMo lives in ../shared/data, never in the repo)"; fi

eval-ablations: build
	@if [ -f "$(LOCOMO)" ]; then $(BIN) eval locomo --data $(LOCOMO) --ablate all; \
	else echo "skipping eval: $(LOCOMO) not found"; fi

# Synthetic load (recollect bench): MiniLM end to end on a sample, then each store size built
# from precomputed embeddings (1,000 conversations, 10 tenants) and queried with the realistic
# mix; prints a table. BENCH_1M=1 adds the million-turn store (hours on 2 cores).
comma := ,
BENCH_SIZES ?= 10000,100000
BENCH_QUERIES ?= 10000
bench: build-release
	mkdir -p $(REPORTS)
	$(RELEASE_BIN) bench --turns $(BENCH_SIZES)$(if $(BENCH_1M),$(comma)1000000) --queries $(BENCH_QUERIES) --json $(REPORTS)/bench.json
	bash scripts/plot.sh bench $(REPORTS)/bench.json $(REPORTS)/bench-latency-cdf.svg

# The same synthetic workload (PEER_TURNS turns, PEER_QUERIES recalls scoped to one conversation)
# through mem0 OSS (infer=False, its local Qdrant store, the same MiniLM through ONNX Runtime) and
# through Recollect's HTTP API, one after the other on this machine: ingest turns/s, recall
# p50/p99 and the ratios; PEER_CANDLE=0 skips the candle row (scripts/bench-peers.sh). Not in `make test`.
PEER_TURNS ?= 10000
PEER_QUERIES ?= 1000
bench-peers: build-release
	PEER_TURNS=$(PEER_TURNS) PEER_QUERIES=$(PEER_QUERIES) REPORTS=$(REPORTS) BIN=$(RELEASE_BIN) bash scripts/bench-peers.sh

# Criterion micro-benchmarks of the hot pieces (tests/benches/hot_paths.rs), in the same dev
# profile as everything else (our hot crates at opt-level 3): the binary that the workspace build made.
bench-micro: setup-test
	cargo build $(CARGO_FLAGS) --workspace --all-targets
	$$(ls -t $(CARGO_TARGET_DIR)/debug/deps/hot_paths-* | grep -v '\.d$$' | head -1) --bench

# Every cargo-fuzz target for FUZZ_SECONDS each (installs cargo-fuzz once; not part of `make test`).
FUZZ_SECONDS ?= 60
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh
