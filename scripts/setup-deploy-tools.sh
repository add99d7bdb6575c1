#!/usr/bin/env bash
# The Python tools that validate the deploy artefacts (scripts/check-deploy.py), in a venv under
# $HOME/.cache/recollect/venv. Idempotent: quick and silent when all are at their versions.
#   helm-python-sdk      Helm v4's engine as a library: renders and lints the chart (no helm binary)
#   kubernetes-validate  the Kubernetes API schemas: validates every rendered object
#   check-jsonschema     vendors the Compose Specification schema (validates deploy/compose.yaml)
#   dockerfile           BuildKit's Dockerfile parser (parses deploy/Dockerfile)
#   PyYAML               reads the manifests, rules and compose file
# and, under $HOME/.cache/recollect/node-tools, Prometheus's PromQL grammar (@prometheus-io/
# lezer-promql, pinned by scripts/promql/package-lock.json) to parse every alert and panel query.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${RECOLLECT_VENV:-${HOME:-/tmp}/.cache/recollect/venv}"
NODE_TOOLS="${RECOLLECT_NODE_TOOLS:-${HOME:-/tmp}/.cache/recollect/node-tools}"
PINS=(
    "helm-python-sdk==0.2.2"
    "kubernetes-validate==1.37.0"
    "check-jsonschema==0.39.0"
    "dockerfile==3.4.0"
    "PyYAML==6.0.3"
)

have_tools() {
    "$VENV/bin/python" - "${PINS[@]}" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
sys.exit(0 if all(version(n) == v for n, v in (p.split("==") for p in sys.argv[1:])) else 1)
PY
}

have_node_tools() {
    cmp -s scripts/promql/package-lock.json "$NODE_TOOLS/package-lock.json" &&
        [[ -d "$NODE_TOOLS/node_modules/@prometheus-io/lezer-promql" ]]
}

if ! have_node_tools; then
    if ! command -v npm >/dev/null 2>&1; then
        if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
            apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
        else
            echo "setup-deploy-tools: node and npm are needed (apt-get install nodejs npm)" >&2
            exit 1
        fi
    fi
    mkdir -p "$NODE_TOOLS"
    cp scripts/promql/package.json scripts/promql/package-lock.json "$NODE_TOOLS/"
    (cd "$NODE_TOOLS" && npm ci --silent --no-audit --no-fund)
    have_node_tools || { echo "setup-deploy-tools: npm ci in $NODE_TOOLS did not take" >&2; exit 1; }
    echo "setup-deploy-tools: lezer-promql in $NODE_TOOLS"
fi

if have_tools; then
    exit 0
fi

# shellcheck source=scripts/venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
ensure_venv "$VENV" setup-deploy-tools || exit 1
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PINS[@]}"
have_tools || { echo "setup-deploy-tools: install into $VENV did not take" >&2; exit 1; }
echo "setup-deploy-tools: ${PINS[*]} in $VENV"
