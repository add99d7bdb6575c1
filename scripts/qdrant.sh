#!/usr/bin/env bash
# Qdrant as the vector test server for the Qdrant adapter's contract suite.
#
#   scripts/qdrant.sh install        idempotent: unpacks ../shared/bin/<xz> (relative to the repo
#                                    root) into $HOME/.cache/recollect/qdrant-1.19.0 once and
#                                    checks both sha256; no .xz there: says so and exits 0
#   scripts/qdrant.sh installed      exit 0 when the binary is installed (for scripts/test.sh)
#   scripts/qdrant.sh start DIR      start a server with its state under DIR on free loopback
#                                    ports; prints QDRANT_URL=.. (gRPC, what the adapter uses)
#                                    QDRANT_HTTP_URL=.. PID=.. lines (also in DIR/env)
#   scripts/qdrant.sh stop DIR       stop the server started with DIR (by its PID)
#
# Qdrant's own QDRANT__* variables pass through to the server: QDRANT__SERVICE__API_KEY requires
# an API key; QDRANT__SERVICE__ENABLE_TLS=true with QDRANT__TLS__CERT and QDRANT__TLS__KEY serves
# both ports over TLS (the URLs are then https://; scripts/test-ca.sh makes a test certificate).
#
# No package registry reachable here provides the server, so the environment ships a binary built
# from the v1.19.0 source in ../shared/bin/ (README.md there). Elsewhere, run the official image
# or release binary and set QDRANT_URL yourself.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

VERSION="1.19.0"
XZ="$ROOT/../shared/bin/qdrant-$VERSION-x86_64-linux-gnu.xz"
XZ_SHA256="a141af891444fc103292d2a62512d408f6693f836a9dd206e7f04dd424f9baaf"
BIN_SHA256="a603576adaf3d37b05487d0ac71f96b763711621f7078c9bc8a1ccc226ee3fab"
BIN="${RECOLLECT_QDRANT_BIN:-${HOME:-/tmp}/.cache/recollect/qdrant-$VERSION}"

sha256() { sha256sum "$1" | cut -d' ' -f1; }

installed() {
  [[ -x "$BIN" ]] && [[ "$(sha256 "$BIN")" == "$BIN_SHA256" ]]
}

install() {
  if installed; then
    echo "qdrant: $VERSION already installed at $BIN (nothing to do)"
    return 0
  fi
  if [[ ! -f "$XZ" ]]; then
    echo "qdrant: $XZ not found, so the Qdrant server is not installed and the Qdrant adapter's" \
      "contract test will skip; to run it, start a Qdrant $VERSION server and set QDRANT_URL" \
      "(its gRPC address, e.g. http://127.0.0.1:6334)"
    return 0
  fi
  local got
  got=$(sha256 "$XZ")
  if [[ "$got" != "$XZ_SHA256" ]]; then
    echo "qdrant: $XZ has sha256 $got, expected $XZ_SHA256; not installing" >&2
    exit 1
  fi
  mkdir -p "$(dirname "$BIN")"
  # Unpacked beside the target and renamed, so an interrupted install leaves no half binary.
  xz -dc "$XZ" >"$BIN.partial"
  got=$(sha256 "$BIN.partial")
  if [[ "$got" != "$BIN_SHA256" ]]; then
    rm -f "$BIN.partial"
    echo "qdrant: unpacked binary has sha256 $got, expected $BIN_SHA256; not installing" >&2
    exit 1
  fi
  chmod +x "$BIN.partial"
  mv "$BIN.partial" "$BIN"
  echo "qdrant: installed $VERSION at $BIN"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

scheme() {
  if [[ "${QDRANT__SERVICE__ENABLE_TLS:-false}" == "true" ]]; then echo https; else echo http; fi
}

http_ready() {
  python3 - "$(scheme)" "$1" <<'PY' 2>/dev/null || true
import ssl, sys, urllib.request
# Readiness only, on loopback: the certificate is the client's business, not the probe's.
ctx = ssl._create_unverified_context()
try:
    print(urllib.request.urlopen(f"{sys.argv[1]}://127.0.0.1:{sys.argv[2]}/readyz", timeout=2,
                                 context=ctx).status)
except Exception:
    print(0)
PY
}

# One attempt on fresh ports. Returns 0 when ready, 2 when the process exited during start (a
# concurrent server may have taken a probed port between probe and bind: worth another try), 1
# when it did not get ready in time.
attempt() {
  local dir="$1" http grpc pid code
  http=$(free_port)
  grpc=$(free_port)
  while [[ "$grpc" == "$http" ]]; do grpc=$(free_port); done
  (
    cd "$dir"
    QDRANT__SERVICE__HOST=127.0.0.1 \
      QDRANT__SERVICE__HTTP_PORT="$http" \
      QDRANT__SERVICE__GRPC_PORT="$grpc" \
      QDRANT__STORAGE__STORAGE_PATH="$dir/storage" \
      QDRANT__STORAGE__SNAPSHOTS_PATH="$dir/snapshots" \
      QDRANT__TELEMETRY_DISABLED=true \
      exec "$BIN"
  ) >"$dir/log/server.out" 2>&1 &
  pid=$!
  echo "$pid" >"$dir/pid"
  for _ in $(seq 1 240); do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid" 2>/dev/null || true
      return 2
    fi
    code=$(http_ready "$http")
    if [[ "$code" == "200" ]]; then
      {
        echo "QDRANT_URL=$(scheme)://127.0.0.1:$grpc"
        echo "QDRANT_HTTP_URL=$(scheme)://127.0.0.1:$http"
        echo "PID=$pid"
      } | tee "$dir/env"
      return 0
    fi
    sleep 0.5
  done
  return 1
}

start() {
  local dir="$1" rc
  installed || { echo "qdrant: not installed; run scripts/qdrant.sh install" >&2; exit 1; }
  mkdir -p "$dir/storage" "$dir/snapshots" "$dir/log"
  dir=$(cd "$dir" && pwd)
  for try in 1 2 3 4 5; do
    rc=0
    attempt "$dir" || rc=$?
    case "$rc" in
      0) return 0 ;;
      2) echo "qdrant: server exited during start (attempt $try); retrying on new ports" >&2
         tail -n 5 "$dir/log/server.out" >&2 ;;
      *) echo "qdrant: not ready after 120 s; log follows" >&2
         tail -n 40 "$dir/log/server.out" >&2
         stop "$dir"
         exit 1 ;;
    esac
  done
  echo "qdrant: server exited during start 5 times; log follows" >&2
  tail -n 40 "$dir/log/server.out" >&2
  exit 1
}

# shellcheck source=scripts/stop.sh
source "$(dirname "${BASH_SOURCE[0]}")/stop.sh"
stop() { stop_server "$1"; }

case "${1:-}" in
  install) install ;;
  installed) installed ;;
  start) start "${2:?usage: qdrant.sh start DIR}" ;;
  stop) stop "${2:?usage: qdrant.sh stop DIR}" ;;
  *) echo "usage: $0 install | installed | start DIR | stop DIR" >&2; exit 2 ;;
esac
