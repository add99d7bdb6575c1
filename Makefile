# Thin wrappers over cargo and scripts/. Every target installs what it needs first and is
# quick when everything is already there.

SHELL := /bin/bash
export CARGO_TARGET_DIR ?= $(HOME)/.cache/recollect/target
BIN := $(CARGO_TARGET_DIR)/debug/recollect
LOCOMO ?= ../shared/data/locomo-dev.json
# One profile (dev: our crates at opt-level 1, dependencies at 3; see Cargo.toml) for run, test,
# eval and bench, so a cold machine compiles the dependencies once. `--release` is for images.
CARGO_FLAGS := --locked

.PHONY: setup build run test lint fmt eval eval-ablations bench fuzz

setup:
	@bash scripts/setup.sh

build: setup
	cargo build $(CARGO_FLAGS) -p recollect

run: build
	$(BIN) serve

test: setup
	bash scripts/test.sh

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

# Synthetic load: ingest end to end, then recall latency. BENCH_TURNS=100000 for the larger run.
BENCH_TURNS ?= 10000
bench: build
	$(BIN) bench --turns $(BENCH_TURNS) --conversations $$(( $(BENCH_TURNS) / 100 )) --queries 1000

# Every cargo-fuzz target for FUZZ_SECONDS each (installs cargo-fuzz once; not part of `make test`).
FUZZ_SECONDS ?= 60
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh
