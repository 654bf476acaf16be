#!/usr/bin/env bash
# scripts/bench/vs_llamacpp.sh's argument handling, with no network and no
# llama.cpp: --help exits 0 and names every option the parser takes; a bad
# option or value exits 2 with a message before anything is fetched or built
# (TPR_LLAMACPP_CACHE points at a folder that must stay empty).
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
[ "$fail" = 0 ] && echo "vs_llamacpp.sh argument handling: ok"
exit "$fail"
