#!/usr/bin/env bash
# `make fuzz`: every cargo-fuzz target for FUZZ_SECONDS (default 60) each, then a summary.
# Installs cargo-fuzz once (crates.io). The machine has only stable Rust: RUSTC_BOOTSTRAP=1 lets
# cargo-fuzz pass its -Z flags, and `-s none` skips AddressSanitizer (safe Rust; unsafe_code is
# forbidden in the workspace), keeping the coverage-guided libFuzzer engine.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/recollect/target}/fuzz"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz (once)"
  cargo install cargo-fuzz --locked
fi

cd fuzz
targets=$(cargo fuzz list)
status=0
summary=""
for t in $targets; do
  log="$CARGO_TARGET_DIR/$t.log"
  mkdir -p "$CARGO_TARGET_DIR" "corpus/$t"
  echo "== $t: ${FUZZ_SECONDS}s"
  if cargo fuzz run -s none "$t" "corpus/$t" -- -max_total_time="$FUZZ_SECONDS" -timeout=10 \
       -rss_limit_mb=2048 -max_len=65536 >"$log" 2>&1; then
    result="ok"
  else
    result="FAILED (see $log and fuzz/artifacts/$t)"
    status=1
  fi
  runs=$(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -1 || true)
  cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1 || true)
  crashes=$(ls "artifacts/$t" 2>/dev/null | wc -l)
  line="$t: ${runs:-no summary} | ${cov:-cov ?} | crash/timeout artefacts: $crashes | $result"
  echo "$line"
  summary+="$line"$'\n'
done
echo
echo "fuzz summary (${FUZZ_SECONDS}s per target):"
printf '%s' "$summary"
exit $status
