# Shared by the tpr serve test scripts (sourced): a work folder $W removed on
# exit with the server $SERVER killed, and ok/FAIL lines counted in $fails;
# a random checkpoint with a tokenizer, starting and stopping a server, and
# tpr run's greedy text to compare with (they read $TPR, $FIX, $NP, $MPIEXEC
# and the checkpoint $W/m).
W=$(mktemp -d "/tmp/${TEST_NAME:-tpr_serve_test}.XXXXXX")
SERVER=""
fails=0
cleanup() { [ -n "$SERVER" ] && kill -KILL "$SERVER" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

launch() {  # launch MODEL_DIR [extra serve flags...]: starts the server, waits for its port
  local dir=$1; shift
  rm -f "$W/port"
  if [ "$NP" -gt 1 ]; then
    "$MPIEXEC" ${MPI_ARGS:-} -np "$NP" --oversubscribe "$TPR" serve --model "$dir" --port 0 --port-file "$W/port" "$@" \
      >"$W/server.log" 2>&1 &
  else
    "$TPR" serve --model "$dir" --port 0 --port-file "$W/port" "$@" >"$W/server.log" 2>&1 &
  fi
  SERVER=$!
  for _ in $(seq 300); do [ -s "$W/port" ] && break; sleep 0.1; done
  [ -s "$W/port" ] || { cat "$W/server.log"; echo "server did not start"; exit 1; }
  URL="http://127.0.0.1:$(cat "$W/port")"
}
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
make_model() {  # make_model CONFIG SEED [make-checkpoint flags...]: random weights in $W/m for CONFIG with its vocab
  # raised to the byte-level fixture tokenizer's 2006 ids (which include <|im_start|> / <|im_end|>), that tokenizer
  # beside them; sets EOS
  local config=$1 seed=$2; shift 2
  python3 - "$config" "$W/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["vocab_size"] = 2006; json.dump(c, open(sys.argv[2], "w"))
PY
  "$TPR" make-checkpoint --config "$W/config.json" --out "$W/m" --seed "$seed" "$@" >/dev/null 2>&1 ||
    "$TPR" make-checkpoint --config "$W/config.json" --out "$W/m" "$@" >/dev/null || { echo "make-checkpoint failed"; exit 1; }
  cp "$FIX/tokenizer/bytelevel/tokenizer.json" "$FIX/tokenizer/bytelevel/tokenizer_config.json" "$W/m/"
  EOS=$("$TPR" tokenize --model "$W/m" --text "<|im_end|>")
}
terminate() {  # terminate PIDS: SIGTERM to the server's ranks (mpirun's children at np > 1); it must exit 0 within 10 s
  local t0 rc
  t0=$(date +%s.%N)
  if [ "$NP" -gt 1 ]; then kill -TERM $1; else kill -TERM "$SERVER"; fi
  for _ in $(seq 100); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$SERVER" 2>/dev/null; then fail "still running 10 s after SIGTERM"; else
    wait "$SERVER"; rc=$?
    echo "exit after SIGTERM: $(python3 -c "print(f'{$(date +%s.%N) - $t0:.2f}')") s, status $rc"
    [ $rc -eq 0 ] && pass "SIGTERM: exit 0 on every rank" || { fail "SIGTERM: exit $rc"; cat "$W/server.log"; }
  fi
  SERVER=""
}
sse_id_text() {  # stdin a streamed completion -> [id, text] as JSON (one id for all its chunks, [DONE] last)
  python3 -c "
import json, sys
lines = [l for l in sys.stdin.read().split('\n') if l.startswith('data: ')]
assert lines[-1] == 'data: [DONE]', 'no [DONE]'
chunks = [json.loads(l[6:]) for l in lines[:-1]]
assert len({c['id'] for c in chunks}) == 1, 'chunks of one stream carry different ids'
print(json.dumps([chunks[0]['id'], ''.join(c['choices'][0].get('text', '') for c in chunks)]))"
}
tally() {  # tally CLIENTS: client c's answers $W/c$c.* ([id, text] each) against $W/e$c -> "right distinct-ids bad-clients"
  python3 - "$W" "$1" <<'PY'
import glob, json, sys
w, n, ok, ids, bad = sys.argv[1], int(sys.argv[2]), 0, [], []
for c in range(n):
    want = open(f"{w}/e{c}", newline="").read()  # keep "\r\n" and NUL as they are
    want = want[:-1] if want.endswith("\n") else want  # tpr detokenize ends its line
    for f in sorted(glob.glob(f"{w}/c{c}.*")):
        try:
            rid, text = json.load(open(f))
        except Exception:
            continue
        ok += text == want
        if text != want and str(c) not in bad:
            bad.append(str(c))
        ids.append(rid)
print(ok, len(set(ids)), " ".join(bad[:4]))
PY
}
