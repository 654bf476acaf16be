#!/usr/bin/env bash
# FSDP's communication: how much of it prefetch hides, side by side in one run.
#
#   scripts/bench/fsdp.sh [--config F] [--np N] [--seq-len T] [--steps S] [--param-dtype f32|bf16] [--json]
#
# Defaults: configs/minimax_m2_small.json, np 2 (dp 2, one thread per rank),
# T 64, S 3 (the first a warm-up). Runs `tpr train --dp N` with
# --no-prefetch (every gather at its layer: all communication exposed) and
# with prefetch (the next layer's gathers in flight during this one), and
# prints per step the all-gather and reduce-scatter ms, the exposed ms, and
# the exposed share against the synchronous run's communication.
set -euo pipefail
cd "$(dirname "$0")/../.."
config=configs/minimax_m2_small.json np=2 seq_len=64 steps=3 dtype=f32 json=0
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config="$2"; shift 2 ;;
    --np) np="$2"; shift 2 ;;
    --seq-len) seq_len="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --param-dtype) dtype="$2"; shift 2 ;;
    --json) json=1; shift ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fsdp.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
tpr=build/bin/tpr
[ -x "$tpr" ] || { echo "fsdp.sh: build first (scripts/setup.sh)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TPR_NUM_THREADS=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 scripts/bench/random_tokens.py "$tmp/tokens.npy" 65536 256
run() {  # $1: label, rest: extra flags; prints the summary JSON line
  mpirun -np "$np" --oversubscribe "$tpr" train --config "$config" --random-init --data "$tmp/tokens.npy" \
    --seq-len "$seq_len" --steps "$steps" --dp "$np" --param-dtype "$dtype" --json "${@:2}" | grep '"summary"'
}
sync_line=$(run sync --no-prefetch)
pre_line=$(run prefetch)
python3 - "$sync_line" "$pre_line" "$json" "$config" "$np" "$dtype" <<'PY'
import json, sys
s, p = (json.loads(x)["summary"] for x in sys.argv[1:3])
want_json, config, np, dtype = sys.argv[3] == "1", sys.argv[4], int(sys.argv[5]), sys.argv[6]
comm = s["fsdp_all_gather_ms"] + s["fsdp_reduce_scatter_ms"]
rows = [("no prefetch", s), ("prefetch", p)]
out = {"config": config, "dp": np, "param_dtype": dtype, "sync_comm_ms": comm,
       "runs": {k: {"ms_per_step": v["ms_per_step"], "all_gather_ms": v["fsdp_all_gather_ms"],
                    "reduce_scatter_ms": v["fsdp_reduce_scatter_ms"], "exposed_ms": v["fsdp_exposed_ms"]}
                for k, v in rows},
       "exposed_share": p["fsdp_exposed_ms"] / comm if comm > 0 else None}
if want_json:
    print(json.dumps(out)); sys.exit(0)
print(f"FSDP on {config}, dp {np}, params {dtype} (per step, rank 0)")
print(f"{'':12} {'ms/step':>10} {'all-gather ms':>14} {'reduce-scatter ms':>18} {'exposed ms':>11}")
for k, v in rows:
    print(f"{k:12} {v['ms_per_step']:10.1f} {v['fsdp_all_gather_ms']:14.1f} {v['fsdp_reduce_scatter_ms']:18.1f} {v['fsdp_exposed_ms']:11.1f}")
print(f"exposed with prefetch / communication without: {out['exposed_share']:.2f}")
PY
