#!/usr/bin/env bash
# `make bench-peers` (not part of `make test`): the same synthetic workload through Recollect and
# through mem0 OSS on this machine in one run, one system at a time; prints each system's ingest
# turns/s, recall p50/p99 and the ratios, and writes $REPORTS/bench-peers.json.
#
#   PEER_TURNS (10000) turns in PEER_TURNS/100 conversations, PEER_QUERIES (1000) recalls, k=30,
#   each scoped to one conversation: `recollect bench --workload-out` writes them.
#   PEER_CANDLE=1 (default) also runs Recollect with its default candle runtime; 0 skips it.
#
# Recollect: `recollect serve` on a free loopback port with embedder.runtime = "onnx", turns
# POSTed per conversation without waiting, the clock stopped when every turn is recallable;
# recalls over one keep-alive HTTP connection once the server is idle. mem0: mem0ai (infer=False:
# no LLM), its default local Qdrant store and SQLite history in a temp dir, and the same
# all-MiniLM-L6-v2 weights and ONNX graph through ONNX Runtime (scripts/bench_peers.py checks its
# vectors against Recollect's). No network: telemetry off, the OpenAI client pointed at a closed
# local port, and the Python side refuses and records every connection beyond loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT_DIR="$PWD/scripts"
CACHE="${RECOLLECT_CACHE:-${HOME:-/tmp}/.cache/recollect}"
BIN="${BIN:-${CARGO_TARGET_DIR:-$CACHE/target}/debug/recollect}"
PEER_TURNS="${PEER_TURNS:-10000}"
PEER_QUERIES="${PEER_QUERIES:-1000}"
PEER_CANDLE="${PEER_CANDLE:-1}"
REPORTS="${REPORTS:-reports}"
VENV="${PEERS_VENV:-$CACHE/venv-peers}"
MODEL_DIR="$CACHE/models/all-MiniLM-L6-v2"
WHEELS="${RECOLLECT_WHEEL_CACHE:-$CACHE/wheels}"

[[ -x "$BIN" ]] || { echo "bench-peers: $BIN not found; run make build-release" >&2; exit 1; }
# The model, ONNX Runtime and MiniLM's graph (Recollect's onnx runtime and the peer's embedder).
bash "$SCRIPT_DIR/setup-onnx.sh" >/dev/null

# The peer's venv: mem0ai and everything it pulls in, pinned exactly (what `pip install mem0ai`
# resolved to on 2026-11-25), plus onnxruntime (the wheel setup-onnx.sh keeps in $WHEELS) and
# tokenizers. No torch, no spaCy, no fastembed: mem0's default install.
PINS="mem0ai==2.2.1 onnxruntime==1.32.0 tokenizers==0.23.3 annotated-types==0.8.0 anyio==4.16.0 backoff==2.2.1
certifi==2026.10.19.post1 charset-normalizer==3.5.3 click==8.5.1 distro==1.9.0 filelock==4.3.1
flatbuffers==25.12.19 fsspec==2026.9.0 grpcio==1.85.3 h11==0.16.0 h2==4.4.1 hf-xet==1.8.0
hpack==4.2.0 httpcore==1.0.9 httpcore2==2.16.2 httpx==0.28.1 httpx2==2.16.2 huggingface-hub==2.4.0
hyperframe==6.1.0 idna==3.20 jiter==0.19.0 numpy==2.4.6 openai==3.57.0 packaging==26.4
portalocker==4.4.2 posthog==7.91.1 protobuf==6.33.6 pydantic==2.14.4 pydantic-core==2.50.5
pytz==2026.6 pyyaml==6.0.4 qdrant-client==1.20.0 requests==2.34.2 sniffio==1.3.1
sqlalchemy==2.1.9 tqdm==4.70.1 truststore==0.10.5 typing-extensions==4.16.0
typing-inspection==0.4.5 urllib3==2.8.0"
STAMP="$VENV/.bench-peers-pins"
want="$(echo "$PINS" | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]]; then
    # shellcheck source=scripts/venv.sh
    source "$SCRIPT_DIR/venv.sh"
    ensure_venv "$VENV" bench-peers
    # shellcheck disable=SC2086
    "$VENV/bin/pip" install -q --disable-pip-version-check --find-links "$WHEELS" $PINS
    echo "$want" >"$STAMP"
    echo "bench-peers: installed mem0ai 2.2.1 and its pinned dependencies into $VENV"
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/bench-peers.XXXXXX")"
SERVER_PID=""
stop_server() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    SERVER_PID=""
}
trap 'stop_server; rm -rf "$WORK"' EXIT

conversations=$(( PEER_TURNS / 100 > 0 ? PEER_TURNS / 100 : 1 ))
# The reference vectors in the workload come from Recollect's candle embedder: the peer's ONNX
# vectors are checked against Recollect's other implementation of the same weights.
export RECOLLECT__EMBEDDER__KIND=minilm RECOLLECT__EMBEDDER__MODEL=all-MiniLM-L6-v2 RECOLLECT__EMBEDDER__LATE_MODEL=
RECOLLECT__EMBEDDER__RUNTIME=candle "$BIN" bench --turns "$PEER_TURNS" --conversations "$conversations" \
    --queries "$PEER_QUERIES" --workload-out "$WORK/workload.jsonl" 2>/dev/null | tail -1

PY="$VENV/bin/python"
parts=()
run_recollect() {
    local runtime="$1" label="$2"
    mkdir -p "$WORK/data-$runtime"
    RECOLLECT__EMBEDDER__RUNTIME="$runtime" RECOLLECT__STORAGE__DATA_DIR="$WORK/data-$runtime" \
    RECOLLECT__SERVER__LISTEN=127.0.0.1:0 RECOLLECT__SERVER__GRPC_LISTEN="" \
    RECOLLECT__SERVER__ADDRESS_FILE="$WORK/address-$runtime.json" \
    RECOLLECT__SERVER__RATE_LIMIT_PER_SEC=0 RECOLLECT__SERVER__UI=false \
        "$BIN" serve >"$WORK/server-$runtime.log" 2>&1 &
    SERVER_PID=$!
    echo "$label: recollect serve (pid $SERVER_PID, embedder.runtime = $runtime)"
    if ! "$PY" "$SCRIPT_DIR/bench_peers.py" recollect "$WORK/workload.jsonl" "$WORK/$label.json" \
        --address-file "$WORK/address-$runtime.json" --server-pid "$SERVER_PID" --label "$label"; then
        tail -20 "$WORK/server-$runtime.log" >&2
        exit 1
    fi
    stop_server
    parts+=("$WORK/$label.json")
}

run_recollect onnx "recollect-onnx"
if [[ "$PEER_CANDLE" == 1 ]]; then
    run_recollect candle "recollect-candle"
fi

# mem0 alone on the machine (every Recollect server stopped). OPENAI_BASE_URL: a port nothing
# listens on, so an LLM or embedding call would fail loudly (and the guard records it).
closed_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$WORK/mem0/home"
echo "mem0: mem0ai 2.2.1, infer=False, local Qdrant in $WORK/mem0"
MEM0_TELEMETRY=False MEM0_DIR="$WORK/mem0/home" HF_HUB_OFFLINE=1 \
OPENAI_API_KEY=unused-by-bench-peers OPENAI_BASE_URL="http://127.0.0.1:$closed_port/v1" \
    "$PY" "$SCRIPT_DIR/bench_peers.py" mem0 "$WORK/workload.jsonl" "$WORK/mem0.json" \
    --model-dir "$MODEL_DIR" --data-dir "$WORK/mem0"
parts+=("$WORK/mem0.json")

mkdir -p "$REPORTS"
"$PY" "$SCRIPT_DIR/bench_peers.py" report "$REPORTS/bench-peers.json" "${parts[@]}"
