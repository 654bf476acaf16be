#!/usr/bin/env bash
# scripts/bench/vs_llamacpp.sh's argument handling, with no network and no
# llama.cpp: --help exits 0 and names every option the parser takes; a bad
# option or value exits 2 with a message before anything is fetched or built
# (TPR_LLAMACPP_CACHE points at a folder that must stay empty); and the
# report's roofline fractions on synthetic runs.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
script="$here/vs_llamacpp.sh"
cache=$(mktemp -d "${TMPDIR:-/tmp}/tpr-test-vs-llamacpp.XXXXXX")
trap 'rm -rf "$cache"' EXIT
export TPR_LLAMACPP_CACHE="$cache"
# Should a bad argument get past the parser, the run stops at the missing tpr
# binary, before any download.
export TPR_BIN=/nonexistent/tpr
fail=0

help=$(bash "$script" --help) || { echo "FAIL: --help exited $?"; fail=1; }
# Every option of the parser's case statement appears in the help text.
for opt in $(grep -oE '^ +--[a-z-]+\)' "$script" | tr -d ' )'); do
  grep -q -- "$opt" <<< "$help" || { echo "FAIL: --help does not mention $opt"; fail=1; }
done
[ "$(grep -cE '^ +--[a-z-]+\)' "$script")" -ge 9 ] || { echo "FAIL: fewer options parsed than expected"; fail=1; }

# $1 expected message fragment, then the arguments: exit 2, the fragment on stderr.
refuse() {
  local want=$1 err rc
  shift
  err=$(bash "$script" "$@" 2>&1 > /dev/null)
  rc=$?
  if [ "$rc" != 2 ] || ! grep -q -- "$want" <<< "$err"; then
    echo "FAIL: vs_llamacpp.sh $* exited $rc (expected 2 with '$want'): $err"
    fail=1
  fi
}
refuse "unknown option --bogus" --bogus
refuse "unknown option" extra-word
refuse "--threads needs a value" --threads
refuse "--threads needs a positive integer" --threads 0
refuse "--threads needs a positive integer" --threads two
refuse "--repeat needs a positive integer" --repeat -1
refuse "--keep is median or best" --keep mean
refuse "--dtype: bf16, f32 or bf16,f32" --dtype q4_0
refuse "--dtype: bf16, f32 or bf16,f32" --dtype bf16,
refuse "--rows: p64, p512, d1, d8, d4k" --rows p64,d2
refuse "--rows: p64, p512, d1, d8, d4k" --rows ""
refuse "--rows: p64, p512, d1, d8, d4k" --rows p64,,d1
refuse "--dtype: bf16, f32 or bf16,f32" --dtype ""
refuse "--idle-wait needs an integer" --idle-wait soon
refuse "--retries needs an integer" --retries -2
refuse "no config" --config /nonexistent/config.json
# A good command line gets past the parser (to the missing binary: exit 1).
err=$(bash "$script" --rows p64,d4k --dtype bf16,f32 --threads 1 --repeat 1 --keep best --idle-wait 0 \
      --retries 0 --tpr-args "--seed 2" --json 2>&1)
rc=$?
{ [ "$rc" = 1 ] && grep -q "no tpr binary at /nonexistent/tpr" <<< "$err"; } ||
  { echo "FAIL: a good command line exited $rc: $err"; fail=1; }
# Nothing was downloaded or built.
[ -z "$(ls -A "$cache")" ] || { echo "FAIL: the cache is not empty: $(ls -A "$cache")"; fail=1; }

# The report: decode b1 against the run's roofline, tpr's and llama.cpp's,
# each llama.cpp run against the roofline of the tpr run of its round
# (rep); medians of 3. llama.cpp's rep 3 has no tpr run: left out.
results="$cache/results.jsonl"
cat > "$results" <<'RUNS'
{"engine": "tpr", "dtype": "bf16", "row": "d1", "rep": 1, "tok_s": 90, "decode_roofline_fraction": 0.9, "decode_roofline_tok_s": 100}
{"engine": "tpr", "dtype": "bf16", "row": "d1", "rep": 2, "tok_s": 190, "decode_roofline_fraction": 0.95, "decode_roofline_tok_s": 200}
{"engine": "tpr", "dtype": "bf16", "row": "d1", "rep": 4, "tok_s": 380, "decode_roofline_fraction": 0.95, "decode_roofline_tok_s": 400}
{"engine": "llama.cpp", "dtype": "bf16", "row": "d1", "rep": 1, "tool": "llama-bench", "tok_s": 80}
{"engine": "llama.cpp", "dtype": "bf16", "row": "d1", "rep": 2, "tool": "llama-bench", "tok_s": 140}
{"engine": "llama.cpp", "dtype": "bf16", "row": "d1", "rep": 3, "tool": "llama-bench", "tok_s": 1}
{"engine": "llama.cpp", "dtype": "bf16", "row": "d1", "rep": 4, "tool": "llama-bench", "tok_s": 300}
RUNS
report=$(python3 "$here/vs_llamacpp.py" report --results "$results" --threads 2 --repeat 3 --json) ||
  { echo "FAIL: report exited $?"; fail=1; }
python3 - "$report" <<'CHECK' || fail=1
import json, sys
row = json.loads(sys.argv[1])["rows"][0]
want = {"tpr_roofline_fraction": 0.95, "llamacpp_roofline_fraction": 0.75}
got = {k: row.get(k) for k in want}
runs = row.get("llamacpp_roofline_fraction_runs")
if got != want or runs != [0.8, 0.7, 0.75]:
    sys.exit(f"FAIL: report row {got}, llama.cpp runs {runs}; want {want}, [0.8, 0.7, 0.75]")
CHECK
[ "$fail" = 0 ] && echo "vs_llamacpp.sh argument handling and report: ok"
exit "$fail"
