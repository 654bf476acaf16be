#!/usr/bin/env bash
# Coverage-guided fuzzing of tpr's parsers (tests/fuzz, libFuzzer + ASan + UBSan).
#
#   scripts/fuzz.sh [--minutes N | --seconds N] [--json] [--jobs J] [TARGET...]
#
# Builds the targets with clang in build-fuzz/ (TPR_FUZZ=ON) and runs each
# TARGET (default: every one in tests/fuzz/targets.cmake) for N minutes
# (default 10) with -timeout=1 -rss_limit_mb=2048, on a copy of its
# committed corpus + regressions (the committed files are never modified).
# Prints one row per target: executions, coverage (edges) and features,
# corpus size, crashes, timeouts, OOMs, leaks; --json prints the same as
# one JSON object. Findings land in build-fuzz/findings/<target>/. Exits
# non-zero on any finding. --jobs J runs J targets at a time (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."

secs=600
json=0
jobs=1
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) secs=$(( $2 * 60 )); shift 2 ;;
    --seconds) secs=$2; shift 2 ;;
    --json) json=1; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=$(sed -n 's/^set(TPR_FUZZ_TARGETS \(.*\))$/\1/p' tests/fuzz/targets.cmake)
[ ${#targets[@]} -gt 0 ] || read -r -a targets <<< "$all"
for t in "${targets[@]}"; do
  case " $all " in *" $t "*) ;; *) echo "fuzz.sh: unknown target '$t' (have: $all)" >&2; exit 2 ;; esac
done

cc=""
for c in clang clang-14 clang-15 clang-16; do command -v "$c" > /dev/null && { cc=$c; break; }; done
[ -n "$cc" ] || { echo "fuzz.sh: clang not found (scripts/test.sh installs it)" >&2; exit 1; }

bd=build-fuzz
if [ ! -f "$bd/CMakeCache.txt" ]; then
  CC=$cc cmake -S . -B "$bd" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPR_CUDA=OFF -DTPR_FUZZ=ON \
    -DBUILD_TESTING=OFF > "$bd.configure.log" 2>&1 || { cat "$bd.configure.log"; exit 1; }
fi
cmake --build "$bd" -j "$(nproc)" --target "${targets[@]/#/fuzz_}" > "$bd/build.log" 2>&1 \
  || { tail -40 "$bd/build.log"; exit 1; }

export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1"
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TPR_NUM_THREADS=1

run_one() {
  local t=$1 work="$bd/work/$1" out="$bd/findings/$1"
  rm -rf "$work" && mkdir -p "$work/corpus" "$out"
  cp tests/fuzz/corpus/"$t"/* "$work/corpus/" 2>/dev/null || true
  find tests/fuzz/regressions/"$t" -maxdepth 1 -type f ! -name '.*' -exec cp {} "$work/corpus/" \;
  # -fork=1: a crash, timeout or OOM is recorded and fuzzing goes on, so
  # one run counts every finding instead of stopping at the first.
  "$bd/bin/fuzz_$t" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
    -max_total_time="$secs" -timeout=1 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$out/" "$work/corpus" > "$work/log" 2>&1 || true
  summarize "$t" > "$work/row"
}

# One line: target execs edges features corpus crashes timeouts ooms leaks
summarize() {
  local t=$1 log="$bd/work/$1/log" out="$bd/findings/$1"
  local execs edges ft corp
  # Fork mode prints "#N: cov: E ft: F corp: C exec/s: ..."; the last wins.
  execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#'); execs=${execs:-0}
  edges=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | awk '{print $2}'); edges=${edges:-0}
  ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -1 | awk '{print $2}'); ft=${ft:-0}
  corp=$(grep -oE 'corp: [0-9]+' "$log" | tail -1 | awk '{print $2}'); corp=${corp:-0}
  local crashes timeouts ooms leaks
  crashes=$(find "$out" -name 'crash-*' | wc -l)
  timeouts=$(find "$out" -name 'timeout-*' | wc -l)
  ooms=$(find "$out" -name 'oom-*' | wc -l)
  leaks=$(find "$out" -name 'leak-*' | wc -l)
  echo "$t $execs $edges $ft $corp $crashes $timeouts $ooms $leaks"
}

rm -rf "$bd/findings"
running=0
for t in "${targets[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
done
wait

found=0
rows=()
for t in "${targets[@]}"; do
  row=$(cat "$bd/work/$t/row")
  rows+=("$row")
  read -r _ _ _ _ _ c to o l <<< "$row"
  [ $((c + to + o + l)) -eq 0 ] || found=1
done

if [ "$json" = 1 ]; then
  printf '{"seconds_per_target": %d, "targets": [' "$secs"
  sep=""
  for row in "${rows[@]}"; do
    read -r t e cov ft corp c to o l <<< "$row"
    printf '%s{"target": "%s", "executions": %d, "coverage_edges": %d, "features": %d, "corpus": %d, "crashes": %d, "timeouts": %d, "ooms": %d, "leaks": %d}' \
      "$sep" "$t" "$e" "$cov" "$ft" "$corp" "$c" "$to" "$o" "$l"
    sep=", "
  done
  printf '], "findings": %s}\n' "$([ $found = 1 ] && echo true || echo false)"
else
  printf '%-12s %12s %8s %9s %7s %8s %9s %5s %6s\n' target executions edges features corpus crashes timeouts ooms leaks
  for row in "${rows[@]}"; do
    read -r t e cov ft corp c to o l <<< "$row"
    printf '%-12s %12s %8s %9s %7s %8s %9s %5s %6s\n' "$t" "$e" "$cov" "$ft" "$corp" "$c" "$to" "$o" "$l"
  done
  echo "fuzz: $((secs)) s per target; findings (inputs) in $bd/findings/<target>/"
fi
if [ "$found" = 1 ]; then
  echo "fuzz: FINDINGS — reproduce with $bd/bin/fuzz_<target> <file>; fix, then commit the input to tests/fuzz/regressions/<target>/" >&2
  exit 1
fi
