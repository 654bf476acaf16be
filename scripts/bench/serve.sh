#!/usr/bin/env bash
# tpr serve's bars, measured from outside against a running server, as a
# client sees it (docs/serve.md):
#
#   scripts/bench/serve.sh [--model DIR] [--np N] [--clients C] [--gen-len G] [--repeat R] [--json]
#
# Defaults: the embedded demo model, np 2, 32 clients, 64 generated tokens,
# 3 alternating runs. Rows:
#   hang-ups       20 clients that hang up mid-stream: the server still answers
#   health         a 16-token request alone and while /health is polled at
#                  10 Hz (median of 10 each): the difference
#   throughput     tpr bench serve --clients C (--repeat R): aggregate tok/s
#                  against tpr bench model --batch C in the same run, TTFT p50
#   stop           SIGTERM to mpirun with 4 streams in flight: streams ended
#                  with finish_reason and [DONE], ranks killed, mpirun's status
set -euo pipefail
cd "$(dirname "$0")/../.."

model=tests/fixtures/demo_model
np=2
clients=32
gen=64
repeat=3
json=0
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --np) np=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --gen-len) gen=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --json) json=1; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "serve.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
TPR=build/bin/tpr
[ -x "$TPR" ] || scripts/setup.sh >&2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
W=$(mktemp -d /tmp/tpr_serve_bench.XXXXXX)
SERVER=""
cleanup() { [ -n "$SERVER" ] && kill -KILL "$SERVER" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
say() { echo "serve.sh: $*" >&2; }

launch() {  # launch [mpirun args...]: the server on a free port
  rm -f "$W/port"
  mpirun "$@" -np "$np" --oversubscribe "$TPR" serve --model "$model" --port 0 --port-file "$W/port" \
    --pid-file "$W/pid" >"$W/server.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 600); do [ -s "$W/port" ] && break; sleep 0.1; done
  [ -s "$W/port" ] || { cat "$W/server.log" >&2; say "the server did not start"; exit 1; }
  URL=http://127.0.0.1:$(cat "$W/port")
}
stop() { kill -TERM "$(cat "$W/pid")"; wait "$SERVER" || true; SERVER=""; }

# -- hang-ups and health polling on one server
launch
say "20 clients hanging up mid-stream"
HANG=$(python3 - "$(cat "$W/port")" <<'PY'
import json, socket, sys
port, ok = int(sys.argv[1]), 0
for i in range(20):
    s = socket.create_connection(("127.0.0.1", port))
    b = json.dumps({"prompt": "Hello", "max_tokens": 300, "stream": True, "ignore_eos": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
    ok += s.recv(4096).startswith(b"HTTP/1.1 200")
    s.close()
print(ok)
PY
)
ALIVE=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/completions" -d '{"prompt": "Hello", "max_tokens": 4}')
say "a 16-token request alone and under 10 Hz /health polling (10 each)"
HEALTH=$(python3 - "$(cat "$W/port")" <<'PY'
import http.client, json, statistics, sys, threading, time
port = int(sys.argv[1])
def request():
    c = http.client.HTTPConnection("127.0.0.1", port)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps({"prompt": "Hello", "max_tokens": 16, "temperature": 0,
                                                     "ignore_eos": True}))
    c.getresponse().read()
    return time.perf_counter() - t0
def series():
    return statistics.median(request() for _ in range(10))
alone = series()
stop = threading.Event()
def poll():
    c = http.client.HTTPConnection("127.0.0.1", port)
    while not stop.is_set():
        c.request("GET", "/health"); c.getresponse().read(); time.sleep(0.1)
t = threading.Thread(target=poll); t.start()
polled = series()
stop.set(); t.join()
print(f"{alone * 1e3:.2f} {polled * 1e3:.2f}")
PY
)
stop
read -r H_ALONE H_POLLED <<<"$HEALTH"

# -- throughput against the engine
say "tpr bench serve --clients $clients --gen-len $gen --np $np --repeat $repeat"
"$TPR" bench serve --model "$model" --clients "$clients" --prompt-len 32 --gen-len "$gen" --np "$np" \
  --repeat "$repeat" --json >"$W/bench.json"

# -- SIGTERM to mpirun with 4 streams in flight
say "SIGTERM to mpirun with 4 streams in flight"
launch --mca odls_base_sigkill_timeout 10
for i in 1 2 3 4; do
  curl -sN "$URL/v1/completions" -d '{"prompt": "Hello", "max_tokens": 500, "stream": true, "ignore_eos": true}' >"$W/s$i" &
done
for _ in $(seq 200); do [ -s "$W/s1" ] && [ -s "$W/s4" ] && break; sleep 0.05; done
kill -TERM "$SERVER"
wait $(jobs -p | grep -v "^$SERVER$") 2>/dev/null || true
RC=0; wait "$SERVER" || RC=$?; SERVER=""
COMPLETE=0
for i in 1 2 3 4; do
  grep -q '"finish_reason":"length"' "$W/s$i" && [ "$(grep -v '^$' "$W/s$i" | tail -1)" = "data: [DONE]" ] &&
    COMPLETE=$((COMPLETE + 1))
done
KILLED=$(grep -ciE "signal 9|killed|exited on signal|non-zero exit" "$W/server.log" || true)

python3 - "$W/bench.json" "$json" "$HANG" "$ALIVE" "$H_ALONE" "$H_POLLED" "$COMPLETE" "$KILLED" "$RC" "$np" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
as_json = sys.argv[2] == "1"
hang, alive, alone, polled, complete, killed, rc, np = sys.argv[3:]
r = {"np": int(np), "clients": b["clients"], "gen_len": b["gen_len"], "cpu_model": b["cpu_model"],
     "hangups_started": int(hang), "answered_after_hangups": alive == "200",
     "request_ms_alone": float(alone), "request_ms_health_10hz": float(polled),
     "health_added_ms": float(polled) - float(alone),
     "serve_tok_s": b["output_tok_s"], "ttft_ms_p50": b["ttft_ms_p50"],
     "baseline_end_to_end_tok_s": b["baseline_end_to_end_tok_s"], "baseline_decode_tok_s": b["baseline_decode_tok_s"],
     "serve_vs_end_to_end": b["serve_vs_baseline_end_to_end"], "serve_vs_decode": b["serve_vs_baseline_decode"],
     "repeat": b["repeat"], "runs": b["runs"],
     "stop_streams_complete": int(complete), "stop_ranks_killed": int(killed), "stop_mpirun_status": int(rc)}
if as_json:
    print(json.dumps(r))
    sys.exit(0)
print(f"tpr serve bars: {b['model']}, np {np}, {b['cpu_model']}")
print("| bar | measured | met |")
print("|---|---|---|")
print(f"| a hang-up never ends the server | {hang}/20 streams hung up, next request {alive} | {'yes' if alive == '200' else 'NO'} |")
print(f"| /health at 10 Hz adds < 50 ms | {float(alone):.1f} ms alone, {float(polled):.1f} ms polled (+{r['health_added_ms']:.1f}) | "
      f"{'yes' if r['health_added_ms'] < 50 else 'NO'} |")
print(f"| {b['clients']} clients >= 0.8x bench model | {b['output_tok_s']:.0f} tok/s: {b['serve_vs_baseline_end_to_end']:.2f}x its end-to-end "
      f"({b['baseline_end_to_end_tok_s']:.0f}), {b['serve_vs_baseline_decode']:.2f}x its decode ({b['baseline_decode_tok_s']:.0f}); median of {b['repeat']} | "
      f"{'yes' if b['serve_vs_baseline_end_to_end'] >= 0.8 else 'NO'} (end-to-end), {'yes' if b['serve_vs_baseline_decode'] >= 0.8 else 'NO'} (decode) |")
print(f"| TTFT p50 < 0.5 s | {b['ttft_ms_p50']:.0f} ms | {'yes' if b['ttft_ms_p50'] < 500 else 'NO'} |")
print(f"| mpirun SIGTERM: every stream complete, exit 0 | {complete}/4 complete, {killed} ranks killed, mpirun status {rc} | "
      f"{'streams yes' if complete == '4' and killed == '0' else 'NO'}; status {'yes' if rc == '0' else 'no (Open MPI 4.1 exits 1)'} |")
PY
