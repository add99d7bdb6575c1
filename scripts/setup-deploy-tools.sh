#!/usr/bin/env bash
# The Python tools that validate the deploy artefacts (scripts/check-deploy.py): Helm's own
# engine as a library (helm-python-sdk embeds Helm v4; no helm binary is needed) and PyYAML, in
# a venv under $HOME/.cache/recollect/venv. Idempotent: quick and silent when both are there.
set -euo pipefail

VENV="${RECOLLECT_VENV:-${HOME:-/tmp}/.cache/recollect/venv}"
HELM_SDK_VERSION="0.2.2"
PYYAML_VERSION="6.0.3"

have_tools() {
    "$VENV/bin/python" - "$HELM_SDK_VERSION" "$PYYAML_VERSION" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
sys.exit(0 if (version("helm-python-sdk"), version("PyYAML")) == (sys.argv[1], sys.argv[2]) else 1)
PY
}

if have_tools; then
    exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    mkdir -p "$(dirname "$VENV")"
    if ! python3 -m venv "$VENV" 2>/dev/null; then
        # Debian's python3 ships venv separately.
        if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
            apt-get install -y -qq python3-venv >/dev/null
            rm -rf "$VENV"
            python3 -m venv "$VENV"
        else
            echo "setup-deploy-tools: python3 -m venv failed; install python3-venv" >&2
            exit 1
        fi
    fi
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "helm-python-sdk==${HELM_SDK_VERSION}" "PyYAML==${PYYAML_VERSION}"
have_tools || { echo "setup-deploy-tools: install into $VENV did not take" >&2; exit 1; }
echo "setup-deploy-tools: helm-python-sdk ${HELM_SDK_VERSION} and PyYAML ${PYYAML_VERSION} in $VENV"
