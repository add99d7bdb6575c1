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
# vendor/ (the patched qdrant-edge): setup.sh wrote it; cheap to check when run on its own.
bash scripts/setup-crates.sh
# The dev profile compiles dependencies with opt-level 3 (Cargo.toml), so model inference and
# vector search run at full speed while our own crates stay quick to rebuild.
cargo build --locked --workspace --all-targets
# The Kafka tests must run here, not skip, on the patched tansu scripts/setup-kafka.sh built.
RECOLLECT_TANSU=$(bash scripts/setup-kafka.sh | tail -1)
export RECOLLECT_TANSU REQUIRE_KAFKA=1

# ArcadeDB (Bolt 4.4 + Cypher) and Qdrant on loopback for the production adapters' contract
# suites: started here, stopped by PID on exit, whatever the outcome (one trap for both).
arcade_dir=$(mktemp -d "${TMPDIR:-/tmp}/recollect-arcadedb.XXXXXX")
qdrant_dir=$(mktemp -d "${TMPDIR:-/tmp}/recollect-qdrant.XXXXXX")
cleanup() {
  bash scripts/qdrant.sh stop "$qdrant_dir" || true
  bash scripts/arcadedb.sh stop "$arcade_dir" || true
  rm -rf "$qdrant_dir" "$arcade_dir"
}
trap cleanup EXIT
echo "== starting ArcadeDB for the graph contract suite"
bash scripts/arcadedb.sh start "$arcade_dir" >/dev/null
# shellcheck disable=SC1091
source "$arcade_dir/env"
export RECOLLECT_TEST_BOLT_URI="bolt://127.0.0.1:$BOLT_PORT"
export RECOLLECT_TEST_BOLT_USER=root
export RECOLLECT_TEST_BOLT_PASSWORD="$PASSWORD"
export RECOLLECT_TEST_BOLT_DATABASE="$DATABASE"
export REQUIRE_ARCADEDB=1
echo "   ArcadeDB pid $PID, Bolt on 127.0.0.1:$BOLT_PORT"

# Qdrant where scripts/setup.sh could install it (this environment ships the server binary in
# ../shared/bin); elsewhere the Qdrant contract test prints why it skipped.
if bash scripts/qdrant.sh installed; then
  echo "== starting Qdrant for the vector contract suite"
  bash scripts/qdrant.sh start "$qdrant_dir" >/dev/null
  # shellcheck disable=SC1091
  source "$qdrant_dir/env"
  export QDRANT_URL QDRANT_HTTP_URL
  export REQUIRE_QDRANT=1
  echo "   Qdrant pid $PID, gRPC on $QDRANT_URL"
else
  echo "== Qdrant not installed (scripts/qdrant.sh install): its contract test will skip"
fi

cargo test --locked --workspace --no-fail-fast

echo "== the Python and TypeScript clients against live servers (and their OpenAPI snapshot)"
bash scripts/test-clients.sh

echo "== the memory browser (/ui) in headless chromium"
bash scripts/test-ui.sh
