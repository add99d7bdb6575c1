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
# The .crate is sha256-checked against the checksum crates.io recorded for it (as Cargo.lock
# has it). Idempotent: quick when vendor/ holds the release with these patches.
set -euo pipefail
cd "$(dirname "$0")/.."

NAME=qdrant-edge
VERSION=0.7.2
SHA256=b2e5e480105a06c8f1703082758d74a13c98fb7a94df06e12d914460786e55ea
# Applied in this order.
PATCHES=(scripts/qdrant-edge/sparse-append.patch scripts/qdrant-edge/unlogged-updates.patch scripts/qdrant-edge/max-sim-half.patch scripts/qdrant-edge/multi-vector-rows.patch scripts/qdrant-edge/segment-close-keeps-cache.patch)
DEST="vendor/$NAME-$VERSION"
# The release's and the patches' checksums name what vendor/ holds: a changed patch re-vendors.
STAMP="$SHA256 $(sha256sum "${PATCHES[@]}" | cut -d' ' -f1 | paste -sd' ')"
if [[ -f "$DEST/.recollect-vendored" && "$(cat "$DEST/.recollect-vendored")" == "$STAMP" ]]; then
  exit 0
fi

CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}"
work=$(mktemp -d "${TMPDIR:-/tmp}/recollect-crates.XXXXXX")
trap 'rm -rf "$work"' EXIT
crate=$(ls "$CARGO_HOME"/registry/cache/*/"$NAME-$VERSION.crate" 2>/dev/null | head -1 || true)
if [[ -z "$crate" ]]; then
  crate="$work/$NAME-$VERSION.crate"
  curl -fsSL --retry 3 -o "$crate" "https://static.crates.io/crates/$NAME/$NAME-$VERSION.crate"
fi
if [[ "$(sha256sum "$crate" | cut -d' ' -f1)" != "$SHA256" ]]; then
  echo "setup-crates: $crate does not match the sha256 crates.io recorded for $NAME $VERSION" >&2
  exit 1
fi
tar -xzf "$crate" -C "$work"
for p in "${PATCHES[@]}"; do
  patch -d "$work/$NAME-$VERSION" -p1 --quiet --forward < "$p"
done
echo "$STAMP" > "$work/$NAME-$VERSION/.recollect-vendored"
mkdir -p vendor
rm -rf "$DEST"
mv "$work/$NAME-$VERSION" "$DEST"
echo "setup-crates: vendored $NAME $VERSION with ${PATCHES[*]}" >&2
