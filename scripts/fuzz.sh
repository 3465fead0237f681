#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time on the seeded corpus in
# fuzz/corpus/<target> (inputs found in this run go to a temp dir, so the
# work tree stays clean), as many targets at once as the machine has CPUs
# (each fuzzer is one process on one CPU). A crash fails the run; its input
# is then copied into fuzz/corpus/<target>/ (the path is printed: commit it)
# so every later run replays it (regression test).
#   scripts/fuzz.sh [seconds per target, default 20]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-20}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked </dev/null
# cargo-fuzz needs nightly-only sanitizer flags; the machine has one stable
# toolchain, which accepts them with RUSTC_BOOTSTRAP.
export RUSTC_BOOTSTRAP=1
[[ $secs =~ ^[0-9]+$ ]] || { echo "fuzz.sh: seconds per target, a whole number: $secs" >&2; exit 2; }
# cargo-fuzz builds each crate as one codegen unit (with the coverage
# instrumentation, ThinLTO imports nothing across units). A short run
# (CI's 10 s a target) takes 16: a build 28 s shorter on two cores for a
# fifth fewer executions a second. (Runs of the other kind build again.)
cgu=()
[ "$secs" -ge 60 ] || cgu=(--codegen-units 16)
cargo fuzz build -O "${cgu[@]}" </dev/null
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# One target: its output in $tmp/<target>.out, its exit status in .rc.
fuzz_one() {
  local t="$1" rc=0
  mkdir -p "$tmp/$t"
  # Crash inputs go to $tmp/<target>.crash-<sha1> (the last
  # -artifact_prefix given wins over cargo-fuzz's own).
  cargo fuzz run -O "${cgu[@]}" "$t" "$tmp/$t" "corpus/$t" -- \
    -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$tmp/$t." \
    >"$tmp/$t.out" 2>&1 </dev/null || rc=$?
  echo "$rc" >"$tmp/$t.rc"
}

mapfile -t targets < <(cargo fuzz list)
cpus="$(nproc)"
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$cpus" ]; do wait -n || true; done
  fuzz_one "$t" &
done
wait

failed=0
for t in "${targets[@]}"; do
  if [ "$(cat "$tmp/$t.rc")" != 0 ]; then
    tail -60 "$tmp/$t.out"
    for a in "$tmp/$t".crash-* "$tmp/$t".leak-* "$tmp/$t".oom-* "$tmp/$t".timeout-*; do
      [ -e "$a" ] || continue
      cp "$a" "corpus/$t/${a##*/$t.}"
      echo "fuzz: $t: the failing input is now fuzz/corpus/$t/${a##*/$t.} (commit it)" >&2
    done
    echo "fuzz target $t FAILED" >&2
    failed=1
    continue
  fi
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$tmp/$t.out")"
  echo "fuzz: $t: ${runs:-?} executions in ${secs}s, no crash"
done
exit "$failed"
