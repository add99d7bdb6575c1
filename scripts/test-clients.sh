#!/usr/bin/env bash
# The SDKs in clients/ against live servers:
#   1. dependencies (scripts/setup-clients.sh: pip into the venv, npm into the cache; quick when there)
#   2. the generated code matches clients/openapi.json (scripts/gen-clients.sh --check)
#   3. the TypeScript client and its tests compile (tsc, strict)
#   4. two `recollect serve` on loopback port 0 (each reports its port), each with its own temp data dir and API keys:
#      one as configured by default, one with tiny limits (1 request/s per tenant, burst 1,
#      4 KiB bodies) for the 429 and 413 paths; stopped by PID on exit, whatever the outcome
#   5. the snapshot matches the live /openapi.json (scripts/check-clients-drift.py)
#   6. Python: pytest (sync, async, errors and retries, LangChain, LlamaIndex, packaging)
#   7. TypeScript: node's built-in test runner
# and prints the counts. Needs the built binary (make build):
#   ${RECOLLECT_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/recollect/target}/debug/recollect}
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS

VENV="${RECOLLECT_VENV:-${HOME:-/tmp}/.cache/recollect/venv}"
BIN="${RECOLLECT_BIN:-${CARGO_TARGET_DIR:-${HOME:-/tmp}/.cache/recollect/target}/debug/recollect}"
if [[ ! -x "$BIN" ]]; then
  echo "test-clients: no server binary at $BIN; build it first (make build)" >&2
  exit 1
fi

step() { printf '== %s (%ds)\n' "$1" $((SECONDS - started)); }

step "client dependencies"
bash scripts/setup-clients.sh
PY="$VENV/bin/python"

step "generated code matches clients/openapi.json"
bash scripts/gen-clients.sh --check

step "TypeScript: tsc"
rm -rf clients/typescript/dist
(cd clients/typescript && ./node_modules/.bin/tsc -p tsconfig.json)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/recollect-clients.XXXXXX")
PIDS=()
CHILD=
cleanup() {
  local pid
  [[ -n "$CHILD" ]] && kill "$CHILD" 2>/dev/null
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Runs a test runner in the background and waits, so that an interrupt stops it with the servers.
run_child() {
  "$@" &
  CHILD=$!
  local status=0
  wait "$CHILD" || status=$?
  CHILD=
  return "$status"
}

# The servers get only the settings below: RECOLLECT_* variables of the caller's shell are dropped.
strip_env=()
while IFS= read -r name; do strip_env+=(-u "$name"); done < <(compgen -e | grep '^RECOLLECT' || true)

# start_server NAME KEYS [VAR=VALUE...]: sets SERVER_URL; the PID joins PIDS (stopped on exit).
start_server() {
  local name=$1 keys=$2
  shift 2
  local pid dir="$tmp/$name-data" addr="$tmp/$name.addr"
  mkdir -p "$dir"
  # Port 0: the server writes the address it bound to server.address_file (no port race).
  env "${strip_env[@]}" RECOLLECT_API_KEYS="$keys" RECOLLECT__EMBEDDER__KIND=hash \
    RECOLLECT__SERVER__ADDRESS_FILE="$addr" "$@" \
    "$BIN" serve --listen "127.0.0.1:0" --grpc-listen "" --data-dir "$dir" >>"$tmp/$name.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  # The bound address, then ready; or the process exited.
  if SERVER_URL=$("$PY" - "$addr" "$pid" <<'PY'
import json, os, sys, time, urllib.request
path, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 120
url = None
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(1)
    if url is None and os.path.exists(path):
        url = "http://" + json.load(open(path))["http"]
    if url is not None:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as r:
                if r.status == 200:
                    print(url)
                    sys.exit(0)
        except OSError:
            pass
    time.sleep(0.05)
print(f"{path}: not ready within 120 s", file=sys.stderr)
sys.exit(2)
PY
  ); then
    echo "   $name: pid $pid on $SERVER_URL (log $tmp/$name.log)"
    return 0
  fi
  echo "test-clients: $name server did not start; its log:" >&2
  tail -n 30 "$tmp/$name.log" >&2
  return 1
}

step "starting the servers ($BIN)"
start_server main "py-key:py,py-other:py-other,py-erase:py-erase,ts-key:ts,ts-other:ts-other,ts-erase:ts-erase"
MAIN_URL=$SERVER_URL
start_server limited "py-limited:py-limited,py-big:py-big,ts-limited:ts-limited,ts-big:ts-big" \
  RECOLLECT__SERVER__RATE_LIMIT_PER_SEC=1 RECOLLECT__SERVER__RATE_LIMIT_BURST=1 \
  RECOLLECT__SERVER__MAX_BODY_BYTES=4096 RECOLLECT__SERVER__MAX_TEXT_BYTES=1024
LIMITED_URL=$SERVER_URL
export RECOLLECT_TEST_URL=$MAIN_URL RECOLLECT_TEST_LIMITED_URL=$LIMITED_URL
unset RECOLLECT_URL RECOLLECT_API_KEY

failed=0
step "snapshot drift: clients/openapi.json against $MAIN_URL/openapi.json"
drift=ok
"$PY" scripts/check-clients-drift.py --url "$MAIN_URL" || { drift=FAILED; failed=1; }

step "Python client: pytest"
py_status=0
run_child env PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$PWD/clients/python/src" \
  "$PY" -m pytest clients/python/tests -q -p no:cacheprovider --junitxml="$tmp/python.xml" || py_status=$?
[[ $py_status -eq 0 ]] || failed=1

step "TypeScript client: node --test"
ts_status=0
run_child node --test --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=tap --test-reporter-destination="$tmp/typescript.tap" clients/typescript/dist/test/*.test.js ||
  ts_status=$?
[[ $ts_status -eq 0 ]] || failed=1

py_counts=$("$PY" - "$tmp/python.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print("no results"); sys.exit()
s = root if root.tag == "testsuite" else root.find("testsuite")
n, f, e, sk = (int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
print(f"{n - f - e - sk} passed, {f + e} failed, {sk} skipped")
PY
)
ts_counts=$(awk '/^# pass/ {p=$3} /^# fail/ {f=$3} /^# skipped/ {s=$3} END {
  if (p == "") print "no results"; else printf "%s passed, %s failed, %s skipped\n", p, f, s }' \
  "$tmp/typescript.tap" 2>/dev/null || echo "no results")

echo
echo "== clients: python ${py_counts}; typescript ${ts_counts}; snapshot drift ${drift} ($((SECONDS - started))s)"
exit $failed
