#!/usr/bin/env bash
# The main job on the embedded default model: installs and builds, then
# generates with the tiny MiniMax-M2 checkpoint (tests/fixtures/minimax_m2_tiny,
# random weights written by transformers' own model class) on 2 ranks under
# mpirun, and checks its logits against transformers' at tp 2.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MODEL=tests/fixtures/minimax_m2_tiny
PROMPT_A=138,5,208,45,52,129,193,193,28,94,228   # reference.safetensors: tokens_a
PROMPT_B=7,184,224,133,88                        # tokens_b
echo
echo "== mpirun -np 2 tpr run --model $MODEL (greedy, 8 new tokens per prompt)"
mpirun -np 2 --oversubscribe build/bin/tpr run --model "$MODEL" \
  --prompt-ids "$PROMPT_A" --prompt-ids "$PROMPT_B" --max-new-tokens 8
echo "   (transformers' greedy continuation of prompt 0: 172 65 194 222 31 65 194 222)"
echo
echo "== mpirun -np 2 tpr run ... --temperature 0.8 --top-p 0.9 --seed 7 --json"
mpirun -np 2 --oversubscribe build/bin/tpr run --model "$MODEL" --prompt-ids "$PROMPT_B" \
  --max-new-tokens 8 --temperature 0.8 --top-p 0.9 --seed 7 --json
echo
echo "== mpirun -np 2 tpr forward: logits of every position vs transformers"
out=$(mktemp -d)
mpirun -np 2 --oversubscribe build/bin/tpr forward --model "$MODEL" --tokens "$PROMPT_A" --out "$out/logits.safetensors"
build/bin/tpr compare --a "$out/logits.safetensors" --a-key logits \
  --b "$MODEL/reference.safetensors" --b-key logits_a
rm -rf "$out"
