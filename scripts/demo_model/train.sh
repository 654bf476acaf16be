#!/usr/bin/env bash
# Trains the embedded demo model (configs/minimax_m2_demo.json) with tpr
# itself: 2 ranks under mpirun, data parallel x expert parallel (dp 2, ep 2:
# each rank holds 4 of the 8 experts of every layer, tokens exchanged all-to-all),
# aux-loss-free balancing of the routing bias on top of the config's small aux loss.
# The validation loss over every 256-token window of val.npy is computed by
# tpr train itself every EVAL_EVERY steps (--eval-data, the windows of
# `tpr eval`); every SAVE_EVERY steps the checkpoint is also copied to
# OUT/snapshots/step-N. scripts/demo_model/curve.sh then draws the curve.
#
# Usage: scripts/demo_model/train.sh [DATA=build/demo_data] [OUT=build/demo_run]
#   STEPS (2000) MB (micro-batch, 4) SEQ (256) LR (3e-3) WARMUP (60) SAVE_EVERY (100)
#   EVAL_EVERY (100) override the run. RESUME=1 continues from OUT/ckpt (the log
#   and the wall time are appended to).
# The committed model is one run of these defaults, in one go, on a quiet
# machine (training.json has its wall time and curve).
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-build/demo_data}
OUT=${2:-build/demo_run}
STEPS=${STEPS:-2000} MB=${MB:-4} SEQ=${SEQ:-256} LR=${LR:-3e-3} WARMUP=${WARMUP:-60}
SAVE_EVERY=${SAVE_EVERY:-100} EVAL_EVERY=${EVAL_EVERY:-100}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$OUT/snapshots"
CKPT="$OUT/ckpt"

# Copies each new checkpoint (the trainer renames DIR.tmp over DIR when a
# save is whole, so a directory seen with a new step is complete).
snapshot() {
  local last=-1
  while :; do
    if [ -f "$CKPT/trainer_state.json" ]; then
      step=$(sed -n 's/.*"step":[[:space:]]*\([0-9]*\).*/\1/p' "$CKPT/trainer_state.json" | head -1)
      if [ -n "$step" ] && [ "$step" != "$last" ]; then
        d="$OUT/snapshots/step-$(printf %05d "$step")"
        mkdir -p "$d.tmp" && cp "$CKPT/config.json" "$CKPT/model.safetensors" "$d.tmp/" && rm -rf "$d" && mv "$d.tmp" "$d"
        last=$step
      fi
    fi
    [ -f "$OUT/done" ] && break
    sleep 5
  done
}
rm -f "$OUT/done"
if [ -n "${RESUME:-}" ]; then
  SRC=(--resume "$CKPT" --seed 20)  # the data order's seed is not taken from the checkpoint
else
  SRC=(--config configs/minimax_m2_demo.json --random-init --seed 20)
  rm -f "$OUT/train.jsonl" "$OUT/wall_s"
fi
snapshot & watcher=$!
start=$(date +%s)
set +e
mpirun -np 2 build/bin/tpr train "${SRC[@]}" \
  --data "$DATA/train.npy" --seq-len "$SEQ" --micro-batch "$MB" --steps "$STEPS" \
  --eval-data "$DATA/val.npy" --eval-every "$EVAL_EVERY" \
  --lr "$LR" --min-lr 3e-4 --warmup "$WARMUP" --weight-decay 0.1 --clip 1.0 --bias-update-rate 1e-3 \
  --tp 1 --dp 2 --ep 2 --no-fsdp --save "$CKPT" --save-every "$SAVE_EVERY" --json >> "$OUT/train.jsonl"
rc=$?
set -e
echo "$(( $(date +%s) - start ))" >> "$OUT/wall_s"
sleep 6; touch "$OUT/done"; wait $watcher
echo "train.sh: exit $rc after $(tail -1 "$OUT/wall_s") s; log $OUT/train.jsonl, snapshots in $OUT/snapshots"
exit $rc
