#!/usr/bin/env bash
# What the SDKs in clients/ need to be generated, built and tested. Idempotent: quick and silent
# when everything is at its pinned version.
#   Python     clients/python/requirements-dev.txt into the project venv
#              (${RECOLLECT_VENV:-$HOME/.cache/recollect/venv}): httpx, pydantic, pytest,
#              langchain-core, llama-index-core, datamodel-code-generator
#   TypeScript clients/typescript/package-lock.json (typescript, openapi-typescript, @types/node)
#              with `npm ci` under ${RECOLLECT_CLIENT_NODE_TOOLS:-$HOME/.cache/recollect/node-clients},
#              linked as clients/typescript/node_modules (the same approach as
#              scripts/setup-deploy-tools.sh takes for its node tools)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${RECOLLECT_VENV:-${HOME:-/tmp}/.cache/recollect/venv}"
NODE_CLIENTS="${RECOLLECT_CLIENT_NODE_TOOLS:-${HOME:-/tmp}/.cache/recollect/node-clients}"
REQS=clients/python/requirements-dev.txt
TS=clients/typescript

have_python_deps() {
    "$VENV/bin/python" - "$REQS" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
pins = [l.split("#")[0].strip() for l in open(sys.argv[1])]
pins = [p.split("==") for p in pins if p]
sys.exit(0 if all(version(n) == v for n, v in pins) else 1)
PY
}

have_node_deps() {
    cmp -s "$TS/package-lock.json" "$NODE_CLIENTS/package-lock.json" &&
        [[ -x "$NODE_CLIENTS/node_modules/.bin/tsc" && -x "$NODE_CLIENTS/node_modules/.bin/openapi-typescript" ]]
}

if ! have_node_deps; then
    if ! command -v npm >/dev/null 2>&1; then
        if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
            apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
        else
            echo "setup-clients: node and npm are needed (apt-get install nodejs npm)" >&2
            exit 1
        fi
    fi
    mkdir -p "$NODE_CLIENTS"
    cp "$TS/package.json" "$TS/package-lock.json" "$NODE_CLIENTS/"
    (cd "$NODE_CLIENTS" && npm ci --silent --no-audit --no-fund --ignore-scripts)
    have_node_deps || { echo "setup-clients: npm ci in $NODE_CLIENTS did not take" >&2; exit 1; }
    echo "setup-clients: typescript, openapi-typescript, @types/node in $NODE_CLIENTS"
fi
# tsc and the generator resolve packages from the project directory: point it at the cache.
if [[ "$(readlink "$TS/node_modules" 2>/dev/null)" != "$NODE_CLIENTS/node_modules" ]]; then
    if [[ -e "$TS/node_modules" && ! -L "$TS/node_modules" ]]; then
        echo "setup-clients: $TS/node_modules is a real directory; remove it to use $NODE_CLIENTS" >&2
        exit 1
    fi
    ln -sfn "$NODE_CLIENTS/node_modules" "$TS/node_modules"
fi

if have_python_deps; then
    exit 0
fi
# shellcheck source=scripts/venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
ensure_venv "$VENV" setup-clients || exit 1
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQS"
have_python_deps || { echo "setup-clients: install into $VENV did not take" >&2; exit 1; }
echo "setup-clients: $(grep -v '^#' "$REQS" | xargs) in $VENV"
