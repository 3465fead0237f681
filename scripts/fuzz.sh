#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time on the seeded corpus in
# fuzz/corpus/<target> (inputs found in this run go to a temp dir, so the
# work tree stays clean). A crash fails the run; its input is then added to
# fuzz/corpus/<target>/ so every later run replays it (regression test).
#   scripts/fuzz.sh [seconds per target, default 20]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-20}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked </dev/null
# cargo-fuzz needs nightly-only sanitizer flags; the machine has one stable
# toolchain, which accepts them with RUSTC_BOOTSTRAP.
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O </dev/null
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for t in $(cargo fuzz list); do
  mkdir -p "$tmp/$t"
  out="$(cargo fuzz run -O "$t" "$tmp/$t" "corpus/$t" -- \
      -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 2>&1 </dev/null)" || {
    echo "$out" | tail -60
    echo "fuzz target $t FAILED" >&2
    exit 1
  }
  runs="$(echo "$out" | sed -n 's/^stat::number_of_executed_units: *//p')"
  echo "fuzz: $t: ${runs:-?} executions in ${secs}s, no crash"
done
