#!/usr/bin/env bash
# tpr serve on a hybrid model (lightning layers, whose per-sequence state
# lives in the engine's state slots, beside attention layers' paged KV
# cache), curl as the client: usage
#   test_serve_hybrid.sh TPR_BINARY FIXTURES_DIR MPIEXEC NP [FIXTURE]
# FIXTURE (a folder of FIXTURES_DIR, default minimax_tiny) gives the config:
#   minimax_tiny       minimax: 3 lightning layers of 4 (block_size 4) beside
#                      softmax attention
#   minicpm_sala_tiny  minicpm_sala: 2 lightning layers beside 2 InfLLM-v2
#                      sparse layers (dense_len 48: the long prompts below
#                      are sparse, and the server's chunks of them end below
#                      and past dense_len, so an answer that depended on the
#                      chunking would show against tpr run's one-step prefill
#                      and between concurrent clients)
# Its vocab raised to the byte-level fixture tokenizer's 2006 ids, random f32
# weights from tpr make-checkpoint (seeded) with the attention's projections
# scaled up so that answers depend on the context, the fixture tokenizer
# copied beside them. The server runs 3 sequences at most (3
# state slots) with a budget of 6 tokens a step, so prompts are prefilled in
# chunks across steps (the state carried from chunk to chunk, across
# lightning blocks) and the later of 12 concurrent clients wait for a slot.
# Checks: /health; greedy completions of prompts of 1 to about 30 tokens equal
# `tpr run --prompt-ids` on the tokenized prompt (detokenized); streamed
# chunks concatenate to the completion; chat with ChatML equals the
# completion of the rendered template, streamed too; a different prompt and
# the last word alone answer differently (the comparison can fail); 12 concurrent clients x 2
# requests (one streamed) all answer as alone, none lost or duplicated;
# SIGTERM exits 0 on every rank.
set -u
TPR=$1 FIX=$2 MPIEXEC=$3 NP=$4 MODEL=${5:-minimax_tiny}
TEST_NAME=tpr_serve_hybrid_test
. "$(dirname "$0")/test_lib.sh"

seed=${TPR_TEST_SEED:-$RANDOM}
echo "seed $seed (weights and prompts drawn from it)"
make_model "$FIX/$MODEL/config.json" "$seed" --dtype f32 --files 1
# Random weights of std 0.02 leave the attention's share of the last hidden
# state too small to move a greedy token: the answer would be the last
# prompt token's alone, and a lost state could not show. The attention's
# projections scaled up (q, k x5, out x10) make every answer read the
# context (a control below checks it).
python3 - "$W/m" <<'PY'
import array, glob, json, struct, sys
scale = {"qkv_proj": 5.0, "q_proj": 5.0, "k_proj": 5.0, "out_proj": 10.0, "o_proj": 10.0}
for f in glob.glob(sys.argv[1] + "/*.safetensors"):
    b = bytearray(open(f, "rb").read())
    n = struct.unpack("<Q", b[:8])[0]
    for k, v in json.loads(b[8:8 + n]).items():
        s = next((x for p, x in scale.items() if k.endswith(f".{p}.weight")), None)
        if k == "__metadata__" or s is None:
            continue
        assert v["dtype"] == "F32", k
        lo, hi = (8 + n + o for o in v["data_offsets"])
        b[lo:hi] = array.array("f", (x * s for x in array.array("f", bytes(b[lo:hi])))).tobytes()
    open(f, "wb").write(b)
PY

launch "$W/m" --max-batch 3 --max-tokens-per-step 6 --max-connections 48
grep -q "recurrent state" "$W/server.log" && pass "the server holds recurrent state slots" ||
  fail "no recurrent state in the server's KV pool line: $(head -3 "$W/server.log")"
[ "$(curl -s "$URL/health" | json 'd["status"]')" = ok ] && pass "/health" || fail "/health"

# -- completions against tpr run (greedy), prompts of 1 to about 30 tokens: within
# one lightning block, across blocks, and longer than a step's budget
long="the model tokens stream chat 42 café 日本 batch engine hello world"
# minicpm_sala: past dense_len (48 tokens) with room to spare
[ "$MODEL" = minicpm_sala_tiny ] && long="$long and $long the end"
for P in "a" "$(prompt_for $((seed % 97)))" "$long"; do
  n=$("$TPR" tokenize --model "$W/m" --text "$P" | tr ',' '\n' | wc -l)
  EXP=$(expected "$P" 12)
  GOT=$(curl -s "$URL/v1/completions" -d "$(body "$P" 12 0)" | json 'd["choices"][0]["text"]')
  [ "$GOT" = "$EXP" ] && pass "completion of a $n-token prompt = tpr run ($(echo -n "$EXP" | wc -c) bytes)" ||
    fail "completion of '$P' ($n tokens): '$GOT' != tpr run '$EXP'"
  STREAMED=$(curl -sN "$URL/v1/completions" -d "$(body "$P" 12 1)" | sse_text)
  [ "$STREAMED" = "$GOT" ] && pass "streamed = the completion ($n-token prompt)" ||
    fail "streamed '$STREAMED' != '$GOT' ($n-token prompt)"
done
# Controls: the comparison can fail -- a different prompt answers
# differently, and so does the long prompt's last word alone (the answer
# reads the earlier chunks, through the state and the KV cache).
OTHER=$(curl -s "$URL/v1/completions" -d "$(body "$long zz" 12 0)" | json 'd["choices"][0]["text"]')
[ "$OTHER" != "$GOT" ] && pass "control: another prompt answers differently" || fail "control: same text for another prompt"
LAST=$(curl -s "$URL/v1/completions" -d "$(body "${long##* }" 12 0)" | json 'd["choices"][0]["text"]')
[ "$LAST" != "$GOT" ] && pass "control: the prompt's last word alone answers differently" ||
  fail "control: the answer ignores the context"

# -- chat: ChatML rendered, then the same as a completion of that text
MSG='"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello world"}],"max_tokens":8,"temperature":0'
CT=$(curl -s "$URL/v1/chat/completions" -d "{$MSG}" | json 'd["choices"][0]["message"]["content"]')
TEMPLATE=$'<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n'
CEXP=$(expected "$TEMPLATE" 8)
[ "$CT" = "$CEXP" ] && pass "chat = tpr run on the ChatML text" || fail "chat '$CT' != '$CEXP'"
CS=$(curl -sN "$URL/v1/chat/completions" -d "{$MSG,\"stream\":true}" | python3 -c "
import json, sys
lines = [l for l in sys.stdin.read().split('\n') if l.startswith('data: ')]
assert lines[-1] == 'data: [DONE]'
print(''.join(json.loads(l[6:])['choices'][0]['delta'].get('content', '') for l in lines[:-1]), end='')")
[ "$CS" = "$CT" ] && pass "streamed chat = chat" || fail "streamed chat '$CS' != '$CT'"

# -- 12 concurrent clients x 2 requests (one streamed) on 3 state slots:
# every answer as alone, every request answered once (distinct ids)
declare -a CP
for c in $(seq 0 11); do
  CP[$c]=$(prompt_for $((seed + c)))
  [ $((c % 3)) -eq 0 ] && CP[$c]="${CP[$c]} $long"  # some longer prompts: chunks of several steps
  expected "${CP[$c]}" 10 >"$W/e$c"  # a file: $(...) would drop a NUL a random model may generate
done
for c in $(seq 0 11); do
  (
    curl -s "$URL/v1/completions" -d "$(body "${CP[$c]}" 10 0)" | json 'json.dumps([d["id"], d["choices"][0]["text"]])' >"$W/c$c.a"
    curl -sN "$URL/v1/completions" -d "$(body "${CP[$c]}" 10 1)" | sse_id_text >"$W/c$c.b"
  ) &
done
wait $(jobs -p | grep -v "^$SERVER$") 2>/dev/null
read -r ok NIDS BAD < <(tally 12)
[ "$ok" -eq 24 ] && [ "$NIDS" -eq 24 ] && pass "12 concurrent clients x 2 requests on 3 state slots: 24/24 as alone, 24 distinct ids" ||
  { fail "concurrent: $ok/24 right, $NIDS distinct ids"; for c in $BAD; do echo "want ($c): $(cat "$W/e$c")"; cat "$W/c$c".*; done;
    tail -5 "$W/server.log"; }

# -- SIGTERM: exit 0 on every rank
terminate "$( [ "$NP" -gt 1 ] && pgrep -P "$SERVER" || echo "$SERVER")"

echo "np $NP: $fails failure(s)"
[ $fails -eq 0 ]
