#!/usr/bin/env bash
# Installs tansu, the Apache-Kafka-compatible broker the Kafka tests run against (sqlite storage:
# its memory engine loses or repeats messages when a consumer resumes from a committed offset).
# Idempotent: quick when the pinned version is already installed. Cold: about 16 minutes.
set -euo pipefail
TANSU_VERSION="${TANSU_VERSION:-0.6.0}"
if command -v tansu >/dev/null 2>&1; then
  exit 0
fi
echo "installing tansu (Kafka-compatible broker for the tests; about 16 minutes cold)..." >&2
cargo install tansu --locked --features libsql ${TANSU_VERSION:+--version "$TANSU_VERSION"}
