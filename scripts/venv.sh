# Sourced by the setup scripts: ensure_venv DIR WHO makes the project's Python venv at DIR when it
# is missing (Debian's python3 ships venv separately: installed with apt when run as root).

# The versions the pinned files are written with (setup-onnx.sh's graphs, setup-model.sh's
# converted weights): other versions may write other bytes, and the digests refuse them.
PY_ARRAY_TOOLS=(numpy==2.4.6 safetensors==0.8.0)
ensure_venv() {
    local venv="$1" who="$2"
    [[ -x "$venv/bin/python" ]] && return 0
    mkdir -p "$(dirname "$venv")"
    if python3 -m venv "$venv" 2>/dev/null; then
        return 0
    fi
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        apt-get install -y -qq python3-venv >/dev/null
        rm -rf "$venv"
        python3 -m venv "$venv"
    else
        echo "$who: python3 -m venv failed; install python3-venv" >&2
        return 1
    fi
}
