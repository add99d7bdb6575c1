#!/usr/bin/env bash
# The test suite: the deploy artefacts (Helm chart, alerts, dashboard, compose, Dockerfile), then
# unit and contract tests of every crate, then end-to-end tests of the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/recollect/target}"
export RECOLLECT_MODEL_DIR="${RECOLLECT_MODEL_DIR:-$PWD/models/all-MiniLM-L6-v2}"

echo "== deploy artefacts: chart rendered and linted by Helm's engine, alerts, dashboard, compose"
"${RECOLLECT_VENV:-$HOME/.cache/recollect/venv}/bin/python" scripts/check-deploy.py --self-test

echo "== Rust: build, unit, contract and end-to-end tests"
# The dev profile compiles dependencies with opt-level 3 (Cargo.toml), so model inference and
# vector search run at full speed while our own crates stay quick to rebuild.
cargo build --locked --workspace --all-targets
# The Kafka end-to-end test must run here, not skip (scripts/setup-kafka.sh installed tansu).
export PATH="$HOME/.cargo/bin:$PATH"
export REQUIRE_KAFKA=1
cargo test --locked --workspace --no-fail-fast
