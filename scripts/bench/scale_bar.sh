#!/usr/bin/env bash
# The accuracy check of the scaling model (docs/scale.md, "How accurate the model is"), as one command:
#
#   scripts/bench/scale_bar.sh [--config F] [--np LIST] [--out DIR] [--quick] [--json]
#
# Defaults: configs/minimax_m2_small.json, np 1,2,4,8, DIR a fresh
# directory under /tmp. Runs two sweeps with `tpr scale run` (each mesh under
# mpirun --oversubscribe, one thread per rank, repeated until stable):
#   train   every np of --np at tp = np, dp = np (FSDP) and tp 2 x dp np/2,
#           each at ep 1 and ep 2: 64-token sequences, 3 optimizer steps;
#   decode  the same meshes (dp replicas of 4 sequences each), 16-token
#           prompts, 16 tokens generated.
# then calibrates the step-time model on the single-rank points and the
# tp = np, ep = 1 meshes (`tpr scale model --calibrate DIR`) and prints, per
# workload, the median and worst absolute error over the other points
# against the bar (median <= 15%, worst <= 30%). --quick: 1 to 2 runs per mesh
# (for a look, not for the committed figures). DIR keeps results.jsonl, predictions.jsonl
# and model_output.txt (the whole table, measured and predicted communication
# per point).
set -euo pipefail
cd "$(dirname "$0")/../.."

config=configs/minimax_m2_small.json
nps=1,2,4,8
out=""
quick=0
json=0
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config="$2"; shift 2 ;;
    --np) nps="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --quick) quick=1; shift ;;
    --json) json=1; shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "scale_bar.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
case "$nps" in ''|*[!0-9,]*) echo "scale_bar.sh: --np needs a list like 1,2,4" >&2; exit 2 ;; esac
[ -f "$config" ] || { echo "scale_bar.sh: no config $config" >&2; exit 2; }
tpr=build/bin/tpr
[ -x "$tpr" ] || { echo "scale_bar.sh: build first (scripts/test.sh or cmake --build build)" >&2; exit 2; }
[ -n "$out" ] || out=$(mktemp -d /tmp/tpr_scale_bar.XXXXXX)
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
reps=(--repeats 3 --max-repeats 5)
[ $quick -eq 1 ] && reps=(--repeats 1 --max-repeats 2)
log() { [ $json -eq 1 ] && echo "$@" >&2 || echo "$@"; }

log "scale bar: $config, np $nps, into $out (load average $(cut -d' ' -f1-3 /proc/loadavg))"
# Each workload at the same meshes: tp 1 (dp = np; FSDP in training), tp 2 x
# dp np/2 and tp = np (np >= 4); ep 1 and 2.
four_up=$(echo "$nps" | tr ',' '\n' | awk '$1 >= 4' | paste -sd, -)
sweep() {  # workload, its options
  local wl=$1
  shift
  "$tpr" scale run --config "$config" --workload "$wl" --np "$nps" --tp 1,2 --ep 1,2 "$@" "${reps[@]}" --out "$out" >&2
  for np in ${four_up//,/ }; do
    "$tpr" scale run --config "$config" --workload "$wl" --np "$np" --tp "$np" --ep 1,2 "$@" "${reps[@]}" --out "$out" >&2
  done
}
sweep train --seq-len 64 --steps 3
sweep decode --batch 4 --prompt-len 16 --gen-len 16
"$tpr" scale model --calibrate "$out" >"$out/model_output.txt"
[ $json -eq 1 ] || cat "$out/model_output.txt"

python3 - "$out" "$json" <<'PY'
import json, sys
out, as_json = sys.argv[1], sys.argv[2] == "1"
rows = [json.loads(l) for l in open(f"{out}/predictions.jsonl") if l.strip()]
res = {}
for wl in ("train", "decode"):
    errs = sorted(abs(r["error"]) for r in rows if r["workload"] == wl and not r["calibration"])
    if not errs:
        continue
    n = len(errs)
    med = errs[n // 2] if n % 2 else (errs[n // 2 - 1] + errs[n // 2]) / 2
    meshes = {(r["tp"], r["dp"], r["ep"]) for r in rows if r["workload"] == wl}
    res[wl] = {"held_out": n, "meshes": len(meshes), "median_abs_error": med, "worst_abs_error": errs[-1],
               "median_ok": med <= 0.15, "worst_ok": errs[-1] <= 0.30}
if as_json:
    print(json.dumps({"dir": out, "bar": {"median": 0.15, "worst": 0.30}, "workloads": res}))
else:
    print(f"\n| workload | held-out points | mesh shapes | median abs error (bar 15%) | worst (bar 30%) |")
    print("|---|---|---|---|---|")
    for wl, r in res.items():
        print(f"| {wl} | {r['held_out']} | {r['meshes']} | {100 * r['median_abs_error']:.1f}% "
              f"{'met' if r['median_ok'] else 'NOT met'} | {100 * r['worst_abs_error']:.1f}% "
              f"{'met' if r['worst_ok'] else 'NOT met'} |")
PY
