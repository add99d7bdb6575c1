#!/usr/bin/env bash
# Sets up `embedder.runtime = "onnx"`: ONNX Runtime's shared library, unpacked from the PyPI
# wheel `onnxruntime` into ~/.cache/recollect/onnxruntime-<version>/, and all-MiniLM-L6-v2 as an
# ONNX graph (model.onnx beside its safetensors) written by scripts/make-onnx.py from the weights
# setup-model.sh installed, and its int8 form (model-int8.onnx, embedder.model =
# "all-MiniLM-L6-v2-int8") written from that graph by scripts/make-onnx-int8.py; and, for each
# E5, MPNet or nomic model scripts/setup-model.sh installed, its f32 graph by make-onnx.py (and
# MPNet's int8 form, "all-mpnet-base-v2-int8", by make-onnx-int8.py). Wheel, library and graphs
# are checked against pinned sha256 digests (the graphs are bit-reproducible from the
# pinned weights and tools). The int8 graphs are not: their calibration runs ONNX Runtime, whose
# float kernels differ by CPU, so make-onnx-int8.py refuses one that strays from the f32 model
# and the digest it had when built is kept beside it (model-int8.onnx.sha256). Idempotent: exits
# at once when all are in place. Prints one line saying what it did.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${RECOLLECT_CACHE:-${HOME:-/tmp}/.cache/recollect}"
WHEELS="${RECOLLECT_WHEEL_CACHE:-$CACHE/wheels}"
ORT_VERSION=1.32.0
ORT_WHEEL="onnxruntime-$ORT_VERSION-cp311-cp311-manylinux_2_28_x86_64.whl"
ORT_WHEEL_SHA256=5a34fc4dfeb5a7b4a74c95dcba1e773d722abda720b474edf1b0c419dc6d163d
ORT_LIB_SHA256=6c1585d1bbf45b0712ea4a21b705c5fcb4ba04ff2e30f1fbf81a49faf658638f
ORT_DIR="$CACHE/onnxruntime-$ORT_VERSION"
ORT_LIB="$ORT_DIR/libonnxruntime.so.$ORT_VERSION"
MODEL_DIR="$CACHE/models/all-MiniLM-L6-v2"
GRAPH="$MODEL_DIR/model.onnx"
GRAPH_SHA256=d03bb1b9e074d912c7c334bf0f81ff99feefd9ad6aa5517d40e14b78fc2e4e4f
INT8="$MODEL_DIR/model-int8.onnx"
# The other models' f32 graphs (model.onnx beside their safetensors), made only for the models
# installed: without one, embedder.runtime "auto" runs an E5 model on candle, with the same
# vectors; all-mpnet-base-v2 runs on ONNX Runtime only.
declare -A MORE_GRAPH_SHA256=(
    [multilingual-e5-small-q4]=f8ddb71ae4dee6b7b2d34b980cb6a981d079e0a2ff7ae773e7ef91658b64b7d0
    [multilingual-e5-small-enpt-q4]=9c82928fc5c8aa2eba05aeb187e8887297b91dfdb7077aa02dbf7aab90ccefef
    [all-mpnet-base-v2]=dce2cf807794feb9fd1320ed320911115a66b3131952a9920fd76782fddb7722
    [nomic-embed-text-v1.5]=65d29554fd0a97d296e872acbe679c598a0cabccba02f75a16fb2c2279137926
)
# Their int8 graphs (model-int8.onnx), written from the f32 graph above.
MORE_INT8=(all-mpnet-base-v2)
# The f32 graphs' bytes depend on these versions; other versions fail the digests above.
# shellcheck source=scripts/venv.sh
source "$SCRIPT_DIR/venv.sh"
PY_TOOLS=(onnx==1.23.2 "${PY_ARRAY_TOOLS[@]}" protobuf==7.36.2 "onnxruntime==$ORT_VERSION"
    tokenizers==0.23.3)

ok() { echo "$1  $2" | sha256sum -c --status - 2>/dev/null; }
# An int8 graph $1 as built here: its recorded digest still matches.
built() { [[ -f "$1" && -f "$1.sha256" ]] && ok "$(cat "$1.sha256")" "$1"; }

# The installed models of the digest map named $1 whose graph file $2 is missing or not the
# pinned one, a line each.
missing() {
    local -n digests="$1"
    local m
    for m in "${!digests[@]}"; do
        if [[ -f "$CACHE/models/$m/model.safetensors" ]] && ! ok "${digests[$m]}" "$CACHE/models/$m/$2"; then
            echo "$m"
        fi
    done
}
mapfile -t GRAPHS_TODO < <(missing MORE_GRAPH_SHA256 model.onnx)
INT8_TODO=()
for m in "${MORE_INT8[@]}"; do
    if [[ -f "$CACHE/models/$m/model.safetensors" ]] && ! built "$CACHE/models/$m/model-int8.onnx"; then
        INT8_TODO+=("$m")
    fi
done

if ok "$ORT_LIB_SHA256" "$ORT_LIB" && ok "$GRAPH_SHA256" "$GRAPH" && built "$INT8" \
    && ((${#GRAPHS_TODO[@]} == 0)) && ((${#INT8_TODO[@]} == 0)); then
    echo "setup-onnx: ONNX Runtime $ORT_VERSION and the models' graphs already present (nothing to do)"
    exit 0
fi
if [[ "$(uname -sm)" != "Linux x86_64" ]]; then
    echo "setup-onnx: the pinned onnxruntime wheel is for Linux x86_64 only" >&2
    exit 1
fi
bash "$SCRIPT_DIR/setup-model.sh" all-MiniLM-L6-v2 >/dev/null

if ! ok "$ORT_LIB_SHA256" "$ORT_LIB"; then
    mkdir -p "$WHEELS"
    if ! ok "$ORT_WHEEL_SHA256" "$WHEELS/$ORT_WHEEL"; then
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
            --platform manylinux_2_28_x86_64 -d "$WHEELS" "onnxruntime==$ORT_VERSION"
        ok "$ORT_WHEEL_SHA256" "$WHEELS/$ORT_WHEEL" || {
            echo "setup-onnx: $WHEELS/$ORT_WHEEL does not match its pinned sha256" >&2
            exit 1
        }
    fi
    tmp="$(mktemp -d "$CACHE/.onnxruntime.XXXXXX")"
    python3 - "$WHEELS/$ORT_WHEEL" "onnxruntime/capi/libonnxruntime.so.$ORT_VERSION" "$tmp" <<'PY'
import sys, zipfile, os
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, open(os.path.join(out, os.path.basename(member)), "wb") as f:
    f.write(z.read(member))
PY
    ok "$ORT_LIB_SHA256" "$tmp/libonnxruntime.so.$ORT_VERSION" || {
        echo "setup-onnx: the library in $ORT_WHEEL does not match its pinned sha256" >&2
        rm -rf "$tmp"
        exit 1
    }
    # A complete directory or none.
    rm -rf "$ORT_DIR" && mv "$tmp" "$ORT_DIR"
fi

if ! ok "$GRAPH_SHA256" "$GRAPH" || ! built "$INT8" || ((${#GRAPHS_TODO[@]} > 0)) \
    || ((${#INT8_TODO[@]} > 0)); then
    VENV="${RECOLLECT_VENV:-$CACHE/venv}"
    ensure_venv "$VENV" setup-onnx
    # The pinned wheel is in the cache already; pip takes it from there.
    "$VENV/bin/pip" install -q --find-links "$WHEELS" "${PY_TOOLS[@]}"
fi
# build OUT DIGEST SCRIPT ARGS... : writes $OUT.tmp with SCRIPT and moves it in place if it has
# DIGEST, or, with DIGEST "-" (an int8 graph, which SCRIPT checked), records its digest beside it.
build() {
    local out="$1" digest="$2"
    shift 2
    "$VENV/bin/python" "$@" "$out.tmp" >/dev/null || {
        rm -f "$out.tmp"
        exit 1
    }
    if [[ "$digest" == - ]]; then
        rm -f "$out.sha256"
        mv "$out.tmp" "$out"
        sha256sum "$out" | cut -d' ' -f1 >"$out.sha256"
        return
    fi
    ok "$digest" "$out.tmp" || {
        echo "setup-onnx: the graph $1 wrote does not match its pinned sha256" \
            "(other tool versions in $VENV than ${PY_TOOLS[*]}?)" >&2
        rm -f "$out.tmp"
        exit 1
    }
    mv "$out.tmp" "$out"
}
if ! ok "$GRAPH_SHA256" "$GRAPH"; then
    build "$GRAPH" "$GRAPH_SHA256" "$SCRIPT_DIR/make-onnx.py" "$MODEL_DIR"
fi
if ! built "$INT8"; then
    build "$INT8" - "$SCRIPT_DIR/make-onnx-int8.py" "$MODEL_DIR" "$GRAPH"
fi
for m in "${GRAPHS_TODO[@]}"; do
    build "$CACHE/models/$m/model.onnx" "${MORE_GRAPH_SHA256[$m]}" "$SCRIPT_DIR/make-onnx.py" \
        "$CACHE/models/$m"
done
for m in "${INT8_TODO[@]}"; do
    build "$CACHE/models/$m/model-int8.onnx" - "$SCRIPT_DIR/make-onnx-int8.py" \
        "$CACHE/models/$m" "$CACHE/models/$m/model.onnx"
done
echo "setup-onnx: ONNX Runtime $ORT_VERSION in $ORT_DIR, MiniLM graphs (f32, int8) in $MODEL_DIR${GRAPHS_TODO[*]:+; the f32 graph of ${GRAPHS_TODO[*]}}${INT8_TODO[*]:+; the int8 graph of ${INT8_TODO[*]}}"
