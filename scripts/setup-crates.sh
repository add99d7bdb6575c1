#!/usr/bin/env bash
# Dependencies Recollect builds from their crates.io release with a patch of ours applied,
# into vendor/ (not committed; Cargo.toml's [patch.crates-io] points there). Every cargo command
# in the workspace needs it, so setup.sh runs it first and the Makefile's cargo targets too.
#
# qdrant-edge 0.7.2 (the embedded vector engine) with scripts/qdrant-edge/sparse-append.patch:
# its sparse posting list rewrote the bound of every earlier element on each append, so writing
# n points that share a term cost O(n²); at 100k turns that was a third of ingest's CPU
# (docs/SPEED.md). Upstream fixed it after 0.7.2, in releases that need rustc 1.97.
# And scripts/qdrant-edge/unlogged-updates.patch: `EdgeShard::set_write_ahead_log(false)` numbers
# updates from the segments' versions without writing them to the engine's log, which the edge
# shard never reads back (Recollect replays its own raw store); the log's CBOR encoding of every
# vector: ~9 % of ingest's CPU at 100k turns, measured (docs/SPEED.md).
# And scripts/qdrant-edge/max-sim-half.patch: MaxSim over half-precision token vectors widens
# each row to f32 once per point instead of both sides of every pair (AVX + FMA + F16C; the
# generic loop elsewhere): late interaction's scan and re-scoring, docs/SPEED.md.
# And scripts/qdrant-edge/multi-vector-rows.patch: a point's token vectors split into rows by
# slices, not itertools' lazy `chunks` (an element at a time through a shared buffer): ~7 % of
# ingest's CPU with late interaction, measured (docs/SPEED.md).
# And scripts/qdrant-edge/segment-close-keeps-cache.patch: closing a segment no longer pages its
# vectors out of the page cache, which walked every token vector at each close and evicted the
# in-RAM vectors the next open reads back: restart of a 1M-turn store, docs/SPEED.md.
#
# neo4rs 0.9.0-rc.11 (the Neo4j adapter's Bolt client) with scripts/neo4rs/tcp-nodelay.patch:
# it never set TCP_NODELAY, so a request larger than its 8 KiB write buffer (a recall's read of
# ~300 turns by key) ended in a segment Nagle's algorithm held for the server's delayed ACK,
# ~40 ms a request (docs/OPERATIONS.md, production-store timings). Neo4j's own drivers set it.
#
# Each .crate is sha256-checked against the checksum crates.io recorded for it (as Cargo.lock
# has it). Idempotent: quick when vendor/ holds the releases with these patches.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/recollect-crates.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# vendor NAME VERSION SHA256 PATCH...: the release in vendor/NAME-VERSION with the patches
# applied in order.
vendor() {
  local name=$1 version=$2 sha256=$3
  shift 3
  local patches=("$@")
  local dest="vendor/$name-$version"
  # The release's and the patches' checksums name what vendor/ holds: a changed patch re-vendors.
  local stamp
  stamp="$sha256 $(sha256sum "${patches[@]}" | cut -d' ' -f1 | paste -sd' ')"
  if [[ -f "$dest/.recollect-vendored" && "$(cat "$dest/.recollect-vendored")" == "$stamp" ]]; then
    return 0
  fi
  local work="$WORK/$name" crate
  mkdir -p "$work"
  crate=$(ls "$CARGO_HOME"/registry/cache/*/"$name-$version.crate" 2>/dev/null | head -1 || true)
  if [[ -z "$crate" ]]; then
    crate="$work/$name-$version.crate"
    curl -fsSL --retry 3 -o "$crate" "https://static.crates.io/crates/$name/$name-$version.crate"
  fi
  if [[ "$(sha256sum "$crate" | cut -d' ' -f1)" != "$sha256" ]]; then
    echo "setup-crates: $crate does not match the sha256 crates.io recorded for $name $version" >&2
    exit 1
  fi
  tar -xzf "$crate" -C "$work"
  for p in "${patches[@]}"; do
    patch -d "$work/$name-$version" -p1 --quiet --forward < "$p"
  done
  echo "$stamp" > "$work/$name-$version/.recollect-vendored"
  mkdir -p vendor
  rm -rf "$dest"
  mv "$work/$name-$version" "$dest"
  echo "setup-crates: vendored $name $version with ${patches[*]}" >&2
}

vendor qdrant-edge 0.7.2 b2e5e480105a06c8f1703082758d74a13c98fb7a94df06e12d914460786e55ea \
  scripts/qdrant-edge/sparse-append.patch scripts/qdrant-edge/unlogged-updates.patch \
  scripts/qdrant-edge/max-sim-half.patch scripts/qdrant-edge/multi-vector-rows.patch \
  scripts/qdrant-edge/segment-close-keeps-cache.patch
vendor neo4rs 0.9.0-rc.11 10cd9e5a406a2a8a82cebf3438ddec3503728c9dcb3c761b3e96478f002f9ff8 \
  scripts/neo4rs/tcp-nodelay.patch
