#!/usr/bin/env bash
# tpr serve under streaming load against the engine alone, side by side:
#
#   scripts/bench/serve.sh [--config F] [--np N] [--clients C] [--prompt-words W]
#                          [--gen-len G] [--json]
#
# Defaults: configs/minimax_m2_small.json, np 2 (tp 2), 16 clients, 12-word
# prompts (~32 tokens), 128 generated tokens each. On one random checkpoint
# of the config (the byte-level test tokenizer beside it):
#   engine  mpirun -np N tpr bench model --model DIR --batch C --prompt-len P
#           --gen-len G: decode tok/s of C sequences stepped together
#           (P: the mean prompt length the server saw)
#   server  mpirun -np N tpr serve --model DIR, then C streaming clients
#           (scripts/bench/serve_client.py) each asking G tokens with
#           ignore_eos: generated tokens / wall time from the first request
#           to the last [DONE] (prefill included), and the time to first
#           token and inter-token latency from the server's /metrics.
# Each side runs twice, alternating, keeping the better run (the machine is
# shared and noisy). The bar: server tok/s >= 0.8 x engine decode tok/s.
set -euo pipefail
cd "$(dirname "$0")/../.."

config=configs/minimax_m2_small.json
np=2
clients=16
words=12
gen=128
json=0
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config="$2"; shift 2 ;;
    --np) np="$2"; shift 2 ;;
    --clients) clients="$2"; shift 2 ;;
    --prompt-words) words="$2"; shift 2 ;;
    --gen-len) gen="$2"; shift 2 ;;
    --json) json=1; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "serve.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
for v in np clients words gen; do
  case "${!v}" in ''|*[!0-9]*) echo "serve.sh: --$v needs a positive integer" >&2; exit 2 ;; esac
  [ "${!v}" -ge 1 ] || { echo "serve.sh: --$v needs a positive integer" >&2; exit 2; }
done
[ -f "$config" ] || { echo "serve.sh: no config $config" >&2; exit 2; }
tpr=build/bin/tpr
[ -x "$tpr" ] || { echo "serve.sh: build first (scripts/test.sh or cmake --build build)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export TPR_NUM_THREADS=$(( $(nproc) / np > 0 ? $(nproc) / np : 1 ))

W=$(mktemp -d /tmp/tpr_bench_serve.XXXXXX)
SERVER=""
cleanup() { [ -n "$SERVER" ] && kill -KILL "$SERVER" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
say() { [ "$json" = 1 ] || echo "$*" >&2; }

say "writing a random checkpoint of $config..."
"$tpr" make-checkpoint --config "$config" --out "$W/m" --seed 1 >/dev/null
cp tests/fixtures/tokenizer/bytelevel/tokenizer.json tests/fixtures/tokenizer/bytelevel/tokenizer_config.json "$W/m/"

server_run() {  # -> one JSON line from the client
  rm -f "$W/port"
  mpirun -np "$np" --oversubscribe "$tpr" serve --model "$W/m" --port 0 --port-file "$W/port" \
    --max-batch "$clients" >"$W/server.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 600); do [ -s "$W/port" ] && break; sleep 0.1; done
  [ -s "$W/port" ] || { cat "$W/server.log" >&2; echo "serve.sh: the server did not start" >&2; exit 1; }
  python3 scripts/bench/serve_client.py "http://127.0.0.1:$(cat "$W/port")" --clients "$clients" \
    --prompt-words "$words" --max-tokens "$gen" || { cat "$W/server.log" >&2; exit 1; }
  kill -TERM $(pgrep -P "$SERVER") 2>/dev/null || kill -TERM "$SERVER"
  wait "$SERVER" || true
  SERVER=""
}
engine_run() {  # prompt_len -> one JSON line
  mpirun -np "$np" --oversubscribe "$tpr" bench model --model "$W/m" --batch "$clients" --prompt-len "$1" \
    --gen-len "$gen" --json | grep '^{'
}
best() {  # field a b -> the JSON line with the larger field
  python3 - "$@" <<'PY'
import json, sys
f, a, b = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
print(json.dumps(a if a[f] >= b[f] else b))
PY
}
say "server with $clients streaming clients, then the engine at batch $clients, twice each (np $np, $gen tokens)..."
s1=$(server_run)
plen=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(max(1, round(d['prompt_tokens'] / d['requests'])))" "$s1")
e1=$(engine_run "$plen"); s2=$(server_run); e2=$(engine_run "$plen")
srv=$(best generated_tok_s "$s1" "$s2")
eng=$(best decode_tok_s "$e1" "$e2")
python3 - "$srv" "$eng" "$json" "$np" "$config" <<'PY'
import json, sys
srv, eng, as_json, np, config = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3] == "1", sys.argv[4], sys.argv[5]
ratio = srv["generated_tok_s"] / eng["decode_tok_s"]
if as_json:
    print(json.dumps({"config": config, "np": int(np), "server": srv, "engine": eng, "ratio": ratio, "bar": 0.8}))
    sys.exit(0)
ms = lambda v: "-" if v is None else f"{1000 * v:.1f}"
t, i = srv["server_ttft"], srv["server_itl"]
print(f"config {config}, np {np}, {srv['clients']} clients x {srv['max_tokens']} tokens, "
      f"prompts ~{round(srv['prompt_tokens'] / srv['requests'])} tokens")
print()
print("| | generated tok/s | TTFT p50 / p90 / mean (ms) | inter-token p50 / p90 / mean (ms) |")
print("|---|---|---|---|")
print(f"| tpr serve, {srv['clients']} streaming clients | {srv['generated_tok_s']:.1f} | "
      f"{ms(t['p50'])} / {ms(t['p90'])} / {ms(t['mean'])} | {ms(i['p50'])} / {ms(i['p90'])} / {ms(i['mean'])} |")
print(f"| tpr bench model --batch {eng['batch']} (decode) | {eng['decode_tok_s']:.1f} | - | - |")
print()
print(f"server / engine decode: {ratio:.2f}x (bar: 0.8x); the server's time includes the prefill of every prompt")
PY
