# Sourced by the test-server scripts: stop_server DIR stops the process whose PID is in DIR/pid
# (TERM, up to 10 s to exit, then KILL) and forgets it. Quick when nothing runs.
stop_server() {
  local dir="$1" pid
  [[ -f "$dir/pid" ]] || return 0
  pid=$(cat "$dir/pid")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 1 40); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.25
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/pid"
}
