#!/usr/bin/env bash
# Speculative decoding against plain decoding in the same run (tpr bench model
# --speculative: both modes on the same prompts, best of --repeat each, greedy
# tokens compared), on
#   - the demo model (tests/fixtures/demo_model) with a copy-heavy prompt:
#     its own greedy answer to a question, then the question again, so the
#     answer to repeat is in the prompt ("repeat this paragraph");
#   - configs/minimax_m2_small.json with random f32 weights (decode bound by
#     weight reads), a prompt of a random span repeated;
# for prompt lookup and self-speculative drafters. Prints a table; --json
# prints one JSON object per row instead. Only ratios of the same run count.
#   scripts/bench/speculative.sh [--json] [--repeat R] [--quick]
set -euo pipefail
cd "$(dirname "$0")/../.."
json=0 repeat=3 quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=1; shift ;;
    --repeat) repeat=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "speculative.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
TPR=build/bin/tpr
[ -x "$TPR" ] || scripts/setup.sh >/dev/null
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
DEMO=tests/fixtures/demo_model
Q="Q: What do you call a"
ANSWER=$("$TPR" run --model "$DEMO" --prompt "$Q" --max-new-tokens 80 --no-stream --json 2>/dev/null |
  python3 -c "import json,sys; print(json.load(sys.stdin)['prompts'][0]['text'], end='')")
printf '%s%s\n\n%s' "$Q" "$ANSWER" "$Q" > "$W/copy.txt"

rows=()
bench() {  # bench LABEL ARGS...
  local label=$1; shift
  local out
  out=$("$TPR" bench model "$@" --repeat "$repeat" --json 2>/dev/null | tail -1) || { echo "bench failed: $*" >&2; return 1; }
  rows+=("$(python3 -c "import json,sys; d=json.loads(sys.argv[2]); d['case']=sys.argv[1]; print(json.dumps(d))" "$label" "$out")")
}
for spec in lookup:3:4 lookup:4:8 self:1:3 self:3:3; do
  bench "demo model, repeat-the-answer prompt" --model "$DEMO" --prompt-file "$W/copy.txt" --gen-len 60 --speculative "$spec"
done
if [ $quick = 0 ]; then
  for spec in lookup:3:4 self:4:3; do
    bench "minimax_m2_small random f32, repeated span" --config configs/minimax_m2_small.json --random-weights \
      --prompt-len 64 --gen-len 64 --speculative "$spec"
  done
fi
if [ $json = 1 ]; then printf '%s\n' "${rows[@]}"; exit 0; fi
cat >"$W/table.py" <<'PY'
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
head = ("case", "drafter", "plain tok/s", "spec tok/s", "speed-up", "accepted", "tok/verify", "same")
print(f"{head[0]:44} {head[1]:11} {head[2]:>11} {head[3]:>10} {head[4]:>8} {head[5]:>8} {head[6]:>10} {head[7]:>5}")
for r in rows:
    print(f"{r['case']:44} {r['speculative']:11} {r['plain_decode_tok_s']:11.1f} {r['speculative_decode_tok_s']:10.1f} "
          f"{r['speedup']:7.2f}x {100 * r['acceptance_rate']:7.1f}% {r['tokens_per_verification']:10.2f} "
          f"{str(r['outputs_identical']):>5}")
PY
printf '%s\n' "${rows[@]}" | python3 "$W/table.py"
