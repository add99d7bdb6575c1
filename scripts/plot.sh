#!/usr/bin/env bash
# Draws a plot from a `recollect eval --json` or `recollect bench --json` file (scripts/plot.py),
# installing matplotlib into the project's venv first (idempotent; quick when present).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${RECOLLECT_VENV:-$HOME/.cache/recollect/venv}"
MATPLOTLIB_VERSION=3.11.2
# shellcheck source=scripts/venv.sh
source scripts/venv.sh
ensure_venv "$VENV" plot || exit 1
if ! "$VENV/bin/python" -c "import matplotlib, sys; sys.exit(matplotlib.__version__ != '$MATPLOTLIB_VERSION')" 2>/dev/null; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "matplotlib==$MATPLOTLIB_VERSION"
fi
exec "$VENV/bin/python" scripts/plot.py "$@"
