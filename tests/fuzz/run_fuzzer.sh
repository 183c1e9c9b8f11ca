#!/usr/bin/env bash
# Runs one libFuzzer target for SECONDS: new inputs go to WORK/corpus (kept between runs),
# crashing inputs to WORK/crashes/, the whole log to WORK/last-run.log; prints libFuzzer's
# final line (executions, cov:, ft:, corpus) and its stats. Exits non-zero on a crash, a
# sanitizer report, a leak or a broken contract (the log's end is printed then).
# usage: run_fuzzer.sh FUZZER WORK SECONDS INPUT_DIR...   (missing input dirs are skipped)
set -euo pipefail
fuzzer=$1 work=$2 seconds=$3
shift 3
mkdir -p "$work/corpus" "$work/crashes"
inputs=()
for d in "$@"; do [ -d "$d" ] && inputs+=("$d"); done
log=$work/last-run.log
rc=0
# -use_value_profile: comparisons (a payload size, a version) guide the search too.
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -use_value_profile=1 \
  -print_final_stats=1 -artifact_prefix="$work/crashes/" "$work/corpus" "${inputs[@]}" \
  >"$log" 2>&1 || rc=$?
name=$(basename "$fuzzer")
if [ "$rc" -ne 0 ]; then
  echo "$name: FAILED (exit $rc); crashing input in $work/crashes/, log $log:"
  tail -n 60 "$log"
  exit "$rc"
fi
echo "$name: $(grep -E '^#[0-9]+' "$log" | tail -n 1)"
grep -E '^stat::' "$log" || true
