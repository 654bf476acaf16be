#!/usr/bin/env bash
# The main job on the embedded default model: installs and builds, then runs
# tests/fixtures/demo_model, a 9.2 M-parameter MiniMax-M2 (8 experts, top-2)
# that tpr itself trained on Debian's fortunes (scripts/demo_model/), on 2
# ranks under mpirun: streaming text generation, a short tpr serve exchange
# with curl, and the logits checked against transformers' committed reference.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MODEL=tests/fixtures/demo_model
MPI=(mpirun -np 2 --oversubscribe)
echo
echo "== mpirun -np 2 tpr run --model $MODEL --prompt \"The meaning of life is\" (tp 2, ep 2, greedy, streamed)"
"${MPI[@]}" build/bin/tpr run --model "$MODEL" --tp 2 --ep 2 --prompt "The meaning of life is" --max-new-tokens 64
echo
echo "== the same, sampled: --temperature 0.8 --top-p 0.95 --seed 3"
"${MPI[@]}" build/bin/tpr run --model "$MODEL" --tp 2 --ep 2 --prompt "Q: What do you call" --max-new-tokens 64 \
  --temperature 0.8 --top-p 0.95 --seed 3
echo
echo "== mpirun -np 2 tpr serve --port 0: one completion, one chat, then SIGTERM"
W=$(mktemp -d)
SERVER=
cleanup() { [ -n "$SERVER" ] && kill -KILL "$SERVER" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
"${MPI[@]}" build/bin/tpr serve --model "$MODEL" --tp 2 --ep 2 --port 0 --port-file "$W/port" --pid-file "$W/pid" \
  >"$W/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 1 300); do [ -s "$W/port" ] && break; sleep 0.1; done
[ -s "$W/port" ] || { cat "$W/server.log"; echo "tpr serve did not start" >&2; exit 1; }
URL=http://127.0.0.1:$(cat "$W/port")
COMPLETION='{"prompt": "A computer is", "max_tokens": 40, "temperature": 0}'
CHAT='{"messages": [{"role": "user", "content": "Tell me a fortune about computers."}], "max_tokens": 60, "temperature": 0}'
echo "\$ curl -s \$URL/v1/completions -d '$COMPLETION'"
curl -s "$URL/v1/completions" -d "$COMPLETION"; echo
echo "\$ curl -s \$URL/v1/chat/completions -d '$CHAT'"
curl -s "$URL/v1/chat/completions" -d "$CHAT"; echo
kill -TERM "$(cat "$W/pid")"  # rank 0 drains and every rank exits 0 (mpirun given a signal exits 1)
rc=0; wait "$SERVER" || rc=$?
SERVER=
echo "tpr serve: exit $rc after SIGTERM"
echo
echo "== mpirun -np 2 tpr forward (tp 2): logits of every position vs transformers (scripts/reference/make_demo_reference.py)"
IDS=$(sed -n 's/.*"ids_csv": "\([0-9,]*\)".*/\1/p' "$MODEL/reference.json" | head -1)  # prompt 0
"${MPI[@]}" build/bin/tpr forward --model "$MODEL" --tp 2 --ep 2 --tokens "$IDS" --out "$W/logits.safetensors"
build/bin/tpr compare --a "$W/logits.safetensors" --a-key logits --b "$MODEL/reference.safetensors" --b-key logits --tol 1e-4
