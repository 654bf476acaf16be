#!/usr/bin/env bash
# After scripts/demo_model/train.sh: the validation loss over all of val.npy's
# 256-token windows (from tpr train's own eval lines; for a log without them,
# `tpr eval` of every snapshot), the unigram/bigram
# baselines on the same targets, a summary JSON and the loss-curve PNG.
# Usage: scripts/demo_model/curve.sh [DATA=build/demo_data] [OUT=build/demo_run] [PNG=docs/demo_model_loss.png]
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-build/demo_data}
OUT=${2:-build/demo_run}
PNG=${3:-docs/demo_model_loss.png}
PY=${PYTHON:-scripts/reference/.venv/bin/python}
SEQ=${SEQ:-256}
EVERY=${EVERY:-100}  # score every EVERY-th step's snapshot
if grep -q '^{"eval"' "$OUT/train.jsonl"; then
  # tpr train --eval-data scored the windows as it went (the last line for a
  # step wins, as for the steps of a resumed part).
  sed -n 's/^{"eval":{"step":\([0-9]*\),"loss":\([^,]*\),.*/\1\t\2/p' "$OUT/train.jsonl" |
    awk -F'\t' '{v[$1] = $2} END {for (s in v) print s "\t" v[s]}' | sort -n > "$OUT/val.tsv"
else
  touch "$OUT/val.tsv"  # snapshots already scored are kept (the curve can be filled in while training runs)
  for d in "$OUT"/snapshots/step-*; do
    step=$((10#${d##*step-}))
    [ $((step % EVERY)) -eq 0 ] || continue
    grep -q "^$step	" "$OUT/val.tsv" && continue
    loss=$(build/bin/tpr eval --model "$d" --data "$DATA/val.npy" --seq-len "$SEQ" --json |
           sed -n 's/.*"loss":\([^,]*\).*/\1/p')
    printf '%d\t%s\n' "$step" "$loss" >> "$OUT/val.tsv"
    echo "step $step: val loss $loss"
  done
fi
"$PY" scripts/demo_model/baselines.py --train "$DATA/train.npy" --val "$DATA/val.npy" --vocab 4096 \
  --seq-len "$SEQ" --out "$OUT/baselines.json" >/dev/null
"$PY" - "$OUT" "$DATA" <<'PY'
import json, sys
out, data = sys.argv[1], sys.argv[2]
steps = {}
for line in open(f"{out}/train.jsonl"):
    d = json.loads(line)
    if "step" in d:
        steps[d["step"]] = d  # a resumed part repeats the steps after its checkpoint: the last one counts
with open(f"{out}/train.tsv", "w") as f:
    k = 20  # running mean over 20 steps
    xs = sorted(steps)
    for i, s in enumerate(xs):
        w = [steps[x]["ce"] for x in xs[max(0, i - k + 1): i + 1]]
        f.write(f"{s + 1}\t{steps[s]['ce']}\t{sum(w) / len(w)}\n")
val = sorted(tuple(map(float, l.split())) for l in open(f"{out}/val.tsv"))
base = json.load(open(f"{out}/baselines.json"))
stats = json.load(open(f"{data}/stats.json"))
last = max(steps)
ms = [steps[s]["ms"] for s in steps]
walls = [int(x) for x in open(f"{out}/wall_s").read().split()]
summary = {"steps": last + 1, "tokens_seen": (last + 1) * 2 * 4 * 256, "train_tokens": stats["train"]["tokens"],
           "wall_s": sum(walls), "wall_s_parts": walls, "step_ms_mean": sum(ms) / len(ms),
           "train_ce_last20": sum(steps[s]["ce"] for s in range(last - 19, last + 1)) / 20,
           "val_curve": [{"step": int(s), "loss": l} for s, l in val],
           "val_loss_final": val[-1][1], "baselines": base, "data": stats}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
with open(f"{out}/baselines.gp", "w") as f:
    f.write(f"uni={base['unigram']}\nbi={base['bigram_interpolated']}\n")
print(json.dumps({k: v for k, v in summary.items() if k not in ("val_curve", "data", "baselines")}))
PY
gnuplot <<GP
load "$OUT/baselines.gp"
set terminal pngcairo size 1000,600 font ',11'
set output "$PNG"
set title "Demo MiniMax-M2 (9.2 M params, 8 experts top-2) trained by tpr train, dp 2 x ep 2, on Debian's fortunes"
set xlabel "optimizer step (2 x 4 x 256 tokens)"
set ylabel "cross-entropy (nats/token)"
set grid
set key top right
set yrange [3:8.5]
plot "$OUT/train.tsv" using 1:2 with lines lc rgb "#c8c8e8" title "train (per step)", \
     "$OUT/train.tsv" using 1:3 with lines lw 2 lc rgb "#2040c0" title "train (mean of 20 steps)", \
     "$OUT/val.tsv" using 1:2 with linespoints lw 2 pt 7 lc rgb "#d02020" title "validation (held-out 5%)", \
     uni with lines dt 2 lc rgb "#808080" title sprintf("unigram baseline %.3f", uni), \
     bi with lines dt 3 lw 2 lc rgb "#208020" title sprintf("bigram baseline (interpolated) %.3f", bi)
GP
echo "curve.sh: $PNG, $OUT/summary.json"
