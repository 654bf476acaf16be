#!/usr/bin/env bash
# Speculative decoding through tpr serve: usage
#   test_speculative.sh TPR_BINARY SOURCE_DIR MPIEXEC NP
# The demo model served with --speculative self:2:3 (every request's drafter
# unless it names one), at tp NP:
#   - greedy completions, plain and streamed, equal tpr run's (no drafts),
#     with the server's drafter, "speculative": "lookup:3:3" and "off";
#   - a sampled request (n 4) with drafts answers;
#   - /metrics counts draft and accepted tokens (accepted <= drafted, > 0);
#   - refusals (400, naming the field): k above the server's 3, another N
#     than the server's 2 layers, a malformed value, a non-string;
#   - the official openai client (when scripts/serve/openai_venv.sh can make
#     its venv) passing "speculative" through extra_body: the same text.
set -u
TPR=$1 SRC=$2 MPIEXEC=$3 NP=$4
TEST_NAME=tpr_spec_serve_test
. "$(dirname "$0")/test_lib.sh"

cp -r "$SRC/tests/fixtures/demo_model" "$W/m"
EOS=$("$TPR" tokenize --model "$W/m" --text "<|endoftext|>" 2>/dev/null || echo -1)
EOS=$(python3 -c "import json; print(json.load(open('$W/m/config.json')).get('eos_token_id', $EOS))")
launch "$W/m" --tp "$NP" --speculative self:2:3
post() { curl -s -m 300 "$URL/v1/completions" -H 'content-type: application/json' -d "$1"; }
req() {  # req PROMPT MAX SPEC(or "") STREAM -> the body
  python3 -c "
import json, sys
b = {'prompt': sys.argv[1], 'max_tokens': int(sys.argv[2]), 'temperature': 0, 'stream': sys.argv[4] == '1'}
if sys.argv[3]: b['speculative'] = sys.argv[3]
print(json.dumps(b))" "$@"
}
P1="Q: What do you call a"
P2="A computer is a computer is a computer is"
P3="The meaning of life is"
for p in "$P1" "$P2" "$P3"; do
  want=$(expected "$p" 40)
  for spec in "" lookup:3:3 off; do
    got=$(post "$(req "$p" 40 "$spec" 0)" | json 'd["choices"][0]["text"]')
    streamed=$(post "$(req "$p" 40 "$spec" 1)" | sse_text)
    [ "$got" = "$want" ] && [ "$streamed" = "$want" ] &&
      pass "'$p' with ${spec:-the default self:2:3}: the same text as tpr run, streamed too" ||
      fail "'$p' with ${spec:-self:2:3}: got '$got' / streamed '$streamed', want '$want'"
  done
done
N=$(post '{"prompt": "Q: What do you call", "max_tokens": 24, "temperature": 1, "n": 4, "seed": 7}' |
  json 'sum(1 for c in d["choices"] if c["finish_reason"] in ("stop", "length"))')
[ "$N" = 4 ] && pass "sampled n 4 with drafts: 4 answers" || fail "sampled n 4: $N answers"
M=$(curl -s "$URL/metrics")
D=$(echo "$M" | awk '/^tpr_spec_decode_num_draft_tokens_total /{print $2}')
A=$(echo "$M" | awk '/^tpr_spec_decode_num_accepted_tokens_total /{print $2}')
[ -n "$D" ] && [ -n "$A" ] && [ "$D" -gt 0 ] && [ "$A" -gt 0 ] && [ "$A" -le "$D" ] &&
  pass "/metrics: $A of $D draft tokens accepted" || fail "/metrics drafts '$D' accepted '$A'"
for bad in '"lookup:3:9"' '"self:1:3"' '"lookup:x"' '5'; do
  R=$(curl -s -m 30 -w '\n%{http_code}' "$URL/v1/completions" -d "{\"prompt\": \"hi\", \"max_tokens\": 4, \"speculative\": $bad}")
  code=$(echo "$R" | tail -1)
  msg=$(echo "$R" | head -n -1 | json 'd["error"]["message"]' 2>/dev/null)
  [ "$code" = 400 ] && echo "$msg" | grep -qi "speculative\|draft" &&
    pass "speculative $bad refused: 400 $msg" || fail "speculative $bad: $code $msg"
done
VENV_PY=${OPENAI_VENV_PY:-}
[ -x "$VENV_PY" ] && "$VENV_PY" -c "import openai" 2>/dev/null || VENV_PY=$("$(dirname "$0")/openai_venv.sh" 2>/dev/null)
if [ -n "$VENV_PY" ] && [ -x "$VENV_PY" ] && "$VENV_PY" -c "import openai" 2>/dev/null; then
  want=$(expected "$P2" 40)
  cat >"$W/client.py" <<'PY'
import sys
from openai import OpenAI
c = OpenAI(base_url=sys.argv[1] + "/v1", api_key="none")
r = c.completions.create(model="m", prompt=sys.argv[2], max_tokens=40, temperature=0,
                         extra_body={"speculative": "lookup:2:3"})
s = c.completions.create(model="m", prompt=sys.argv[2], max_tokens=40, temperature=0, stream=True)
streamed = "".join(ch.choices[0].text for ch in s)
assert streamed == r.choices[0].text, (streamed, r.choices[0].text)
print(r.choices[0].text, end="")
PY
  got=$("$VENV_PY" "$W/client.py" "$URL" "$P2")
  [ "$got" = "$want" ] && pass "openai client with extra_body speculative: the same text, streamed too" ||
    fail "openai client: got '$got', want '$want'"
else
  echo "skipped: the openai client check (no venv with openai)"
fi
terminate "$(pgrep -P "$SERVER" 2>/dev/null | tr '\n' ' ')"
[ $fails = 0 ] && echo "all passed" || { echo "$fails failed"; tail -20 "$W/server.log"; exit 1; }
