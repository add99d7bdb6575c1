# Thin wrappers over cargo and scripts/. Every target installs what it needs first and is
# quick when everything is already there.

SHELL := /bin/bash
export CARGO_TARGET_DIR ?= $(HOME)/.cache/recollect/target
BIN := $(CARGO_TARGET_DIR)/debug/recollect
LOCOMO ?= ../shared/data/locomo-dev.json
# One profile (dev: our crates at opt-level 1, dependencies at 3; see Cargo.toml) for run, test,
# eval and bench, so a cold machine compiles the dependencies once. `--release` is for images.
CARGO_FLAGS := --locked

.PHONY: setup build run test lint fmt eval eval-ablations bench bench-micro e2e-kafka check-deploy fuzz

setup:
	@bash scripts/setup.sh

build: setup
	cargo build $(CARGO_FLAGS) -p recollect

run: build
	$(BIN) serve

test: setup
	bash scripts/test.sh

# The distributed pipeline alone: tansu + every service as a process (tests/tests/kafka_e2e.rs).
# E2E_EMBEDDER=minilm measures with the local model instead of the hash embedder.
E2E_EMBEDDER ?= hash
e2e-kafka: setup
	cargo build $(CARGO_FLAGS) --workspace --all-targets
	@# The test binary itself: `cargo test --test NAME` would resolve features differently and
	@# rebuild the big dependencies.
	PATH="$$HOME/.cargo/bin:$$PATH" REQUIRE_KAFKA=1 RECOLLECT_E2E_EMBEDDER=$(E2E_EMBEDDER) \
	RECOLLECT_MODEL_DIR=$${RECOLLECT_MODEL_DIR:-$(CURDIR)/models/all-MiniLM-L6-v2} \
	$$(ls -t $(CARGO_TARGET_DIR)/debug/deps/kafka_e2e-* | grep -v '\.d$$' | head -1) --nocapture

# Only the deploy artefacts (also part of `make test`): no Rust build.
check-deploy: setup
	$${RECOLLECT_VENV:-$$HOME/.cache/recollect/venv}/bin/python scripts/check-deploy.py --self-test

lint:
	cargo fmt --all -- --check
	cargo clippy $(CARGO_FLAGS) --workspace --all-targets -- -D warnings

fmt:
	cargo fmt --all

eval: build
	@if [ -f "$(LOCOMO)" ]; then $(BIN) eval locomo --data $(LOCOMO) --dump-rankings $(CARGO_TARGET_DIR)/locomo-rankings.json; \
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
bench: build
	$(BIN) bench --turns $(BENCH_SIZES)$(if $(BENCH_1M),$(comma)1000000) --queries $(BENCH_QUERIES)

# Criterion micro-benchmarks of the hot pieces (tests/benches/hot_paths.rs), in the same dev
# profile as everything else (our hot crates at opt-level 3): the binary that the workspace build made.
bench-micro: setup
	cargo build $(CARGO_FLAGS) --workspace --all-targets
	$$(ls -t $(CARGO_TARGET_DIR)/debug/deps/hot_paths-* | grep -v '\.d$$' | head -1) --bench

# Every cargo-fuzz target for FUZZ_SECONDS each (installs cargo-fuzz once; not part of `make test`).
FUZZ_SECONDS ?= 60
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh
