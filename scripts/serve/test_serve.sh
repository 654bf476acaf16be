#!/usr/bin/env bash
# tpr serve over real sockets, curl as the client: usage
#   test_serve.sh TPR_BINARY FIXTURES_DIR MPIEXEC NP
# A random tiny MiniMax-M2 checkpoint (vocab raised to the byte-level fixture
# tokenizer's 2006 ids, which include <|im_start|> / <|im_end|>) is served
# on a free port. Checks: /health, /v1/models; greedy completions equal
# `tpr run --prompt-ids` on the tokenized prompt (detokenized); streamed
# chunks concatenate to the non-streamed text and end with [DONE]; chat with
# ChatML equals the completion of the rendered template; 8 concurrent clients
# x 2 requests (half streamed) all answer as alone; bad requests get the
# right status and OpenAI-shaped errors, and /health still answers after;
# SIGTERM exits 0 on every rank within a few seconds.
set -u
TPR=$1 FIX=$2 MPIEXEC=$3 NP=$4
W=$(mktemp -d /tmp/tpr_serve_test.XXXXXX)
SERVER=""
fails=0
cleanup() { [ -n "$SERVER" ] && kill -KILL "$SERVER" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

seed=${TPR_TEST_SEED:-$RANDOM}
echo "seed $seed (prompts drawn from it)"
python3 - "$FIX/minimax_m2_tiny/config.json" "$W/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["vocab_size"] = 2006; json.dump(c, open(sys.argv[2], "w"))
PY
"$TPR" make-checkpoint --config "$W/config.json" --out "$W/m" --seed "$seed" >/dev/null 2>&1 ||
  "$TPR" make-checkpoint --config "$W/config.json" --out "$W/m" >/dev/null || { echo "make-checkpoint failed"; exit 1; }
cp "$FIX/tokenizer/bytelevel/tokenizer.json" "$FIX/tokenizer/bytelevel/tokenizer_config.json" "$W/m/"
EOS=$("$TPR" tokenize --model "$W/m" --text "<|im_end|>")

launch() {  # launch [extra serve flags...]: starts the server, waits for its port
  rm -f "$W/port"
  if [ "$NP" -gt 1 ]; then
    "$MPIEXEC" -np "$NP" --oversubscribe "$TPR" serve --model "$W/m" --port 0 --port-file "$W/port" "$@" \
      >"$W/server.log" 2>&1 &
  else
    "$TPR" serve --model "$W/m" --port 0 --port-file "$W/port" "$@" >"$W/server.log" 2>&1 &
  fi
  SERVER=$!
  for _ in $(seq 300); do [ -s "$W/port" ] && break; sleep 0.1; done
  [ -s "$W/port" ] || { cat "$W/server.log"; echo "server did not start"; exit 1; }
  URL="http://127.0.0.1:$(cat "$W/port")"
}
launch

# -- health and models
[ "$(curl -s "$URL/health" | json 'd["status"]')" = ok ] && pass "/health" || fail "/health"
[ "$(curl -s "$URL/v1/models" | json 'd["data"][0]["id"]')" = m ] && pass "/v1/models lists 'm'" || fail "/v1/models"

# -- completions against tpr run (greedy): the same ids, detokenized
words=(hello world the model tokens stream chat 42 café 日本 batch engine)
prompt_for() { local s=$1 p=""; for k in 0 1 2 3; do p+="${words[$(( (s * 7 + k * 13 + k * s) % ${#words[@]} ))]} "; done; echo -n "${p% }"; }
expected() {  # expected PROMPT MAX_NEW: tpr run's greedy text (stopping at EOS, which is dropped as special)
  local ids gen
  ids=$("$TPR" tokenize --model "$W/m" --text "$1")
  gen=$("$TPR" run --model "$W/m" --prompt-ids "$ids" --max-new-tokens "$2" --stop-token "$EOS" --json |
    json '",".join(map(str, d["prompts"][0]["generated"]))')
  "$TPR" detokenize --model "$W/m" --ids "$gen" --skip-special 2>/dev/null ||
    "$TPR" detokenize --model "$W/m" --ids "$gen"
}
body() { python3 -c "import json,sys; print(json.dumps({'prompt': sys.argv[1], 'max_tokens': int(sys.argv[2]), 'temperature': 0, 'stream': sys.argv[3] == '1'}))" "$@"; }
sse_text() { python3 -c "
import json, sys
lines = [l for l in sys.stdin.read().split('\n') if l.startswith('data: ')]
assert lines[-1] == 'data: [DONE]', 'no [DONE]'
print(''.join(json.loads(l[6:])['choices'][0].get('text', '') for l in lines[:-1]), end='')"; }

P=$(prompt_for $((seed % 97)))
EXP=$(expected "$P" 12)
GOT=$(curl -s "$URL/v1/completions" -d "$(body "$P" 12 0)" | json 'd["choices"][0]["text"]')
[ "$GOT" = "$EXP" ] && pass "completion of '$P' = tpr run ($(echo -n "$EXP" | wc -c) bytes)" ||
  fail "completion '$GOT' != tpr run '$EXP'"
USAGE=$(curl -s "$URL/v1/completions" -d "$(body "$P" 12 0)" | json 'd["usage"]["prompt_tokens"], d["usage"]["completion_tokens"], d["object"]')
NIDS=$("$TPR" tokenize --model "$W/m" --text "$P" | tr ',' '\n' | wc -l)
[[ "$USAGE" == "$NIDS 12 text_completion" ]] && pass "usage: $USAGE (prompt $NIDS ids)" || fail "usage '$USAGE', prompt $NIDS ids"
STREAMED=$(curl -sN "$URL/v1/completions" -d "$(body "$P" 12 1)" | sse_text)
[ "$STREAMED" = "$GOT" ] && pass "streamed chunks concatenate to the completion" || fail "streamed '$STREAMED' != '$GOT'"
# Negative control: a different prompt gives a different answer (the comparison can fail).
OTHER=$(curl -s "$URL/v1/completions" -d "$(body "$P zz" 12 0)" | json 'd["choices"][0]["text"]')
[ "$OTHER" != "$GOT" ] && pass "control: another prompt answers differently" || fail "control: same text for another prompt"

# -- chat: ChatML rendered, then the same as a completion of that text
CHAT=$(curl -s "$URL/v1/chat/completions" -d '{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello world"}],"max_tokens":8,"temperature":0}')
CT=$(echo "$CHAT" | json 'd["choices"][0]["message"]["content"]')
TEMPLATE=$'<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n'
CEXP=$(expected "$TEMPLATE" 8)
[ "$CT" = "$CEXP" ] && [ "$(echo "$CHAT" | json 'd["object"]')" = chat.completion ] && pass "chat = tpr run on the ChatML text" ||
  fail "chat '$CT' != '$CEXP'"
CS=$(curl -sN "$URL/v1/chat/completions" -d '{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello world"}],"max_tokens":8,"temperature":0,"stream":true}' |
  python3 -c "
import json, sys
lines = [l for l in sys.stdin.read().split('\n') if l.startswith('data: ')]
assert lines[-1] == 'data: [DONE]'
print(''.join(json.loads(l[6:])['choices'][0]['delta'].get('content', '') for l in lines[:-1]), end='')")
[ "$CS" = "$CT" ] && pass "streamed chat = chat" || fail "streamed chat '$CS' != '$CT'"

# -- stop strings end the text before the stop string
if [ ${#GOT} -ge 4 ]; then
  STOP=${GOT:2:2}
  S=$(curl -s "$URL/v1/completions" -d "$(python3 -c "import json,sys; print(json.dumps({'prompt': sys.argv[1], 'max_tokens': 12, 'temperature': 0, 'stop': [sys.argv[2]]}))" "$P" "$STOP")")
  ST=$(echo "$S" | json 'd["choices"][0]["text"]')
  FR=$(echo "$S" | json 'd["choices"][0]["finish_reason"]')
  PREFIX=${GOT%%"$STOP"*}
  [ "$ST" = "$PREFIX" ] && [ "$FR" = stop ] && pass "stop '$STOP' cuts the text (finish_reason stop)" || fail "stop: '$ST' ($FR) != '$PREFIX'"
fi

# -- 8 concurrent clients x 2 requests (one streamed, one not): same as alone
declare -a CP CE
for c in $(seq 0 7); do CP[$c]=$(prompt_for $((seed + c))); CE[$c]=$(expected "${CP[$c]}" 10); done
for c in $(seq 0 7); do
  (
    curl -s "$URL/v1/completions" -d "$(body "${CP[$c]}" 10 0)" | json 'd["choices"][0]["text"]' >"$W/c$c.a"
    curl -sN "$URL/v1/completions" -d "$(body "${CP[$c]}" 10 1)" | sse_text >"$W/c$c.b"
  ) &
done
wait $(jobs -p | grep -v "^$SERVER$") 2>/dev/null
ok=0
for c in $(seq 0 7); do
  [ "$(cat "$W/c$c.a")" = "${CE[$c]}" ] && ok=$((ok + 1))
  [ "$(cat "$W/c$c.b")" = "${CE[$c]}" ] && ok=$((ok + 1))
done
[ $ok -eq 16 ] && pass "8 concurrent clients x 2 requests: 16/16 as alone" || fail "concurrent: $ok/16 right"

# -- bad requests: status and an OpenAI-shaped error; the server lives on
check_status() {  # check_status WANT NAME curl-args...
  local want=$1 name=$2; shift 2
  local out code
  out=$(curl -s -w '\n%{http_code}' "$@")
  code=${out##*$'\n'}
  if [ "$code" = "$want" ] && { [ "$want" = 200 ] || echo "${out%$'\n'*}" | json 'd["error"]["message"]' >/dev/null 2>&1; }; then
    pass "$name -> $code"
  else
    fail "$name -> $code (want $want): ${out%$'\n'*}"
  fi
}
check_status 400 "malformed JSON" "$URL/v1/completions" -d '{"prompt": "a",'
check_status 400 "prompt of the wrong type" "$URL/v1/completions" -d '{"prompt": 5}'
check_status 400 "max_tokens a string" "$URL/v1/completions" -d '{"prompt": "a", "max_tokens": "3"}'
check_status 400 "missing prompt" "$URL/v1/completions" -d '{"max_tokens": 3}'
check_status 400 "max_tokens 0" "$URL/v1/completions" -d '{"prompt": "a", "max_tokens": 0}'
check_status 400 "max_tokens -1" "$URL/v1/completions" -d '{"prompt": "a", "max_tokens": -1}'
check_status 400 "max_tokens past the context" "$URL/v1/completions" -d '{"prompt": "a", "max_tokens": 100000}'
check_status 400 "chat without messages" "$URL/v1/chat/completions" -d '{"max_tokens": 3}'
check_status 400 "chat message without role" "$URL/v1/chat/completions" -d '{"messages": [{"content": "x"}]}'
check_status 404 "unknown model" "$URL/v1/completions" -d '{"model": "gpt-4", "prompt": "a"}'
check_status 404 "unknown path" "$URL/v2/nothing"
check_status 405 "GET on completions" "$URL/v1/completions"
head -c 1100000 /dev/zero | tr '\0' 'a' >"$W/big"
check_status 413 "body over 1 MiB" "$URL/v1/completions" --data-binary @"$W/big"
check_status 413 "chunked body over 1 MiB" "$URL/v1/completions" -H "Transfer-Encoding: chunked" --data-binary @"$W/big"
check_status 200 "chunked request body" "$URL/v1/completions" -H "Transfer-Encoding: chunked" -d '{"prompt": "hello", "max_tokens": 2}'
R=$(printf 'BROKEN\r\n\r\n' | timeout 5 python3 -c "
import socket, sys; s = socket.create_connection(('127.0.0.1', $(cat "$W/port"))); s.sendall(sys.stdin.buffer.read()); print(s.recv(100).split(b' ')[1].decode())")
[ "$R" = 400 ] && pass "garbage request line -> 400" || fail "garbage request line -> '$R'"
[ "$(curl -s "$URL/health" | json 'd["status"]')" = ok ] && pass "/health after the bad requests" || fail "server died"
# keep-alive: two requests on one connection
KA=$(curl -s -v "$URL/health" "$URL/health" 2>&1 | grep -c "Re-using existing connection\|Reusing existing")
[ "$KA" -ge 1 ] && pass "keep-alive: curl reused the connection" || fail "keep-alive not used"
curl -s "$URL/metrics" | grep -q '^tpr_requests_total{status="413"}' && pass "/metrics" || fail "/metrics"
# A client that goes away mid-stream: its sequence is cancelled (blocks back
# to the pool), the server keeps answering.
R=$(timeout 5 python3 -c "
import socket, json
s = socket.create_connection(('127.0.0.1', $(cat "$W/port")))
b = json.dumps({'prompt': 'hello world', 'max_tokens': 40, 'temperature': 0, 'stream': True}).encode()
s.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n' % len(b) + b)
print(s.recv(20).split(b' ')[1].decode()); s.close()")
BLOCKS=1
for _ in $(seq 50); do
  BLOCKS=$(curl -s "$URL/metrics" | awk '/^tpr_kv_blocks_in_use /{print $2}')
  [ "$BLOCKS" = 0 ] && break; sleep 0.1
done
[ "$R" = 200 ] && [ "$BLOCKS" = 0 ] && [ "$(curl -s "$URL/health" | json 'd["status"]')" = ok ] &&
  pass "client gone mid-stream: blocks in use back to 0, server healthy" || fail "disconnect: status '$R', blocks '$BLOCKS'"

# -- idle CPU of every rank (a few ticks), then SIGTERM: exit 0 within a few seconds
PIDS=$( [ "$NP" -gt 1 ] && pgrep -P "$SERVER" || echo "$SERVER")
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
declare -A T1
for p in $PIDS; do T1[$p]=$(cpu_ticks "$p"); done
sleep 3
for p in $PIDS; do
  pct=$(( ($(cpu_ticks "$p") - ${T1[$p]}) * 100 / $(getconf CLK_TCK) / 3 ))
  echo "idle rank pid $p: ${pct}% of a core over 3 s (/proc stat)"
  [ $pct -le 30 ] && pass "idle rank pid $p sleeps (${pct}% CPU)" || fail "idle rank pid $p spins: ${pct}% CPU"
done
T0=$(date +%s.%N)
if [ "$NP" -gt 1 ]; then kill -TERM $PIDS; else kill -TERM "$SERVER"; fi
for _ in $(seq 100); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$SERVER" 2>/dev/null; then fail "still running 10 s after SIGTERM"; else
  wait "$SERVER"; RC=$?
  echo "exit after SIGTERM: $(python3 -c "print(f'{$(date +%s.%N) - $T0:.2f}')") s, status $RC"
  [ $RC -eq 0 ] && pass "SIGTERM: exit 0 on every rank" || { fail "SIGTERM: exit $RC"; cat "$W/server.log"; }
fi
SERVER=""
echo "np $NP: $fails failure(s)"
[ $fails -eq 0 ]
