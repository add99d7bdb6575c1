#!/usr/bin/env bash
# Installs tansu 0.6.0, the Apache-Kafka-compatible broker the Kafka tests run against (sqlite
# storage: its memory engine loses or repeats messages when a consumer resumes from a committed
# offset), built from the crates.io sources with scripts/tansu/group-coordinator.patch applied:
# tansu 0.6.0's group coordinator never reassigns the partitions of a member that dies (an
# expired member is dropped without a new generation, so the old assignment stays) and leaves a
# member that joins after the leader's assignment without partitions. Upstream fixed the
# coordinator after 0.6.0 (renamed nisshi), but those releases need rustc 1.96.
#
# Idempotent: quick when the patched binary is there. Cold: about 16 minutes on 2 cores.
# Prints the binary's path on stdout's last line; the tests find it in the same place.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.6.0
PATCH=scripts/tansu/group-coordinator.patch
CACHE="${RECOLLECT_CACHE:-$HOME/.cache/recollect}"
# The patch's checksum names the install, so a changed patch builds a new binary.
SUM=$(sha256sum "$PATCH" | cut -c1-12)
ROOT="$CACHE/tansu-$VERSION-$SUM"
if [[ -x "$ROOT/bin/tansu" ]]; then
  echo "$ROOT/bin/tansu"
  exit 0
fi
echo "building tansu $VERSION with the group-coordinator patch (about 16 minutes cold)..." >&2
BUILD="$CACHE/tansu-build"
mkdir -p "$BUILD"
# Download the two crates (and everything tansu needs) through cargo, from crates.io.
FETCH="$BUILD/fetch"
mkdir -p "$FETCH/src"
cat > "$FETCH/Cargo.toml" <<TOML
[package]
name = "tansu-fetch"
version = "0.0.0"
edition = "2021"
publish = false
[dependencies]
tansu = { version = "=$VERSION", features = ["libsql"] }
tansu-broker = "=$VERSION"
[workspace]
TOML
touch "$FETCH/src/lib.rs"
cargo fetch --manifest-path "$FETCH/Cargo.toml" >&2
CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}"
crate() { ls "$CARGO_HOME"/registry/cache/*/"$1-$VERSION.crate" | head -1; }
rm -rf "$BUILD/tansu-$VERSION" "$BUILD/tansu-broker-$VERSION"
tar -xzf "$(crate tansu)" -C "$BUILD"
tar -xzf "$(crate tansu-broker)" -C "$BUILD"
patch -d "$BUILD/tansu-broker-$VERSION" -p1 < "$PATCH" >&2
cat >> "$BUILD/tansu-$VERSION/Cargo.toml" <<TOML

[patch.crates-io]
tansu-broker = { path = "../tansu-broker-$VERSION" }
TOML
# The published Cargo.lock pins every other dependency; cargo rewrites only the patched entry.
# A path dependency is linted as local code: cap lints so a newer compiler's warning cannot fail it.
RUSTFLAGS="--cap-lints=warn" CARGO_TARGET_DIR="$BUILD/target" \
  cargo build --release --manifest-path "$BUILD/tansu-$VERSION/Cargo.toml" --features libsql --bin tansu >&2
mkdir -p "$ROOT/bin"
cp "$BUILD/target/release/tansu" "$ROOT/bin/tansu.partial"
mv "$ROOT/bin/tansu.partial" "$ROOT/bin/tansu"
echo "$ROOT/bin/tansu"
