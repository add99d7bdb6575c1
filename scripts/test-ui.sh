#!/usr/bin/env bash
# The memory browser (/ui) in a real browser: Debian's chromium and chromium-driver, driven by
# selenium from PyPI, against the built `recollect serve` on loopback port 0 with a temporary
# data directory. Installs what is missing (idempotent: quick when present), starts the server,
# runs tests/ui/browser_test.py, and stops the server by PID whatever the outcome.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${RECOLLECT_VENV:-$HOME/.cache/recollect/venv}"
BIN="${CARGO_TARGET_DIR:-$HOME/.cache/recollect/target}/debug/recollect"
# 4.52 needs a certifi newer than the registry holds.
SELENIUM_VERSION=4.50.0

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "test-ui: installing chromium and chromium-driver (Debian)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "test-ui: chromium and chromium-driver are needed (apt-get install chromium chromium-driver)" >&2
    exit 1
  fi
fi
# shellcheck source=scripts/venv.sh
source scripts/venv.sh
ensure_venv "$VENV" test-ui || exit 1
if ! "$VENV/bin/python" -c "import selenium, sys; sys.exit(selenium.__version__ != '$SELENIUM_VERSION')" 2>/dev/null; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "selenium==$SELENIUM_VERSION"
fi
[[ -x "$BIN" ]] || { echo "test-ui: $BIN not built (make build)" >&2; exit 1; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/recollect-ui.XXXXXX")
# Port 0: the server writes the address it bound to server.address_file.
RECOLLECT__SERVER__LISTEN="127.0.0.1:0" RECOLLECT__SERVER__GRPC_LISTEN="" \
RECOLLECT__SERVER__ADDRESS_FILE="$dir/addr.json" \
RECOLLECT__STORAGE__DATA_DIR="$dir/data" RECOLLECT__EMBEDDER__KIND=hash \
RECOLLECT_API_KEYS="ui-key:ui-tenant" RECOLLECT__TELEMETRY__LOG_LEVEL=warn \
  "$BIN" serve >"$dir/server.log" 2>&1 &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
url=""
for _ in $(seq 1 300); do
  [[ -z "$url" && -s "$dir/addr.json" ]] &&
    url="http://$("$VENV/bin/python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["http"])' "$dir/addr.json")"
  [[ -n "$url" ]] && curl -sf "$url/readyz" >/dev/null && break
  kill -0 "$pid" 2>/dev/null || { cat "$dir/server.log" >&2; exit 1; }
  sleep 0.1
done
[[ -n "$url" ]] || { echo "test-ui: the server did not report its address" >&2; cat "$dir/server.log" >&2; exit 1; }
"$VENV/bin/python" tests/ui/browser_test.py "$url" ui-key
