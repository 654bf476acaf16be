#!/usr/bin/env bash
# FSDP's step communication across namespace hosts against the link itself,
# in one run: `tpr bench comm` all_gather and reduce_scatter between 2 hosts x
# 1 rank, then `tpr train` at dp 2 across the same hosts (FSDP, prefetch off
# so every collective is timed alone), and the ratio of the step's busbw
# (nccl-tests' (n-1)/n * bytes / time, from the per-step --json) to the
# link's best busbw at 1-64 MiB.
#
#   scripts/cluster/bench_train.sh [--tpr PATH] [--config F] [--seq-len T] [--steps S] [--json]
#
# Defaults: configs/minimax_m2_small.json, T 32, S 3 (the first a warm-up).
# Brings up its own hosts and takes them down; exit 77 without namespaces.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tpr="$here/../../build/bin/tpr" config="$here/../../configs/minimax_m2_small.json" seq_len=32 steps=3 json=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tpr) tpr="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --seq-len) seq_len="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --json) json=1; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_train.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$tpr" ] || { echo "bench_train.sh: $tpr is not built" >&2; exit 2; }
config="$(cd "$(dirname "$config")" && pwd)/$(basename "$config")"
export TPR_CLUSTER_TAG="tprt$$" TPR_NUM_THREADS=1
work=$(mktemp -d)
trap '"$here/hosts.sh" down; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
"$here/hosts.sh" up 2 >/dev/null
python3 "$here/../bench/random_tokens.py" "$work/tokens.npy" 32768 256
for op in all_gather reduce_scatter; do
  "$here/mpirun.sh" --hosts 2 --ranks-per-host 1 -- "$tpr" bench comm -o "$op" -b 1M -e 64M -f 4 -n 5 -w 2 --json \
    > "$work/link.$op"
done
"$here/mpirun.sh" --hosts 2 --ranks-per-host 1 -- "$tpr" train --config "$config" --random-init \
  --data "$work/tokens.npy" --seq-len "$seq_len" --steps "$steps" --dp 2 --no-prefetch --json > "$work/train"
python3 - "$work" "$json" "$config" <<'PY'
import json, sys
work, as_json, config = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
link = {}
for op in ("all_gather", "reduce_scatter"):
    rows = [json.loads(l) for l in open(f"{work}/link.{op}") if l.startswith("{")]
    link[op] = max(r["busbw"] for r in rows if r.get("kind") == "result")
steps = [json.loads(l) for l in open(f"{work}/train") if l.startswith('{"step"')][1:]  # the first is a warm-up
n = 2
def busbw(bytes_key, ms_key):
    b = sum(s["fsdp"][bytes_key] for s in steps); t = sum(s["fsdp"][ms_key] for s in steps) * 1e-3
    return (n - 1) / n * b / t / 1e9 if t > 0 else 0.0
got = {"all_gather": busbw("all_gather_bytes", "all_gather_ms"),
       "reduce_scatter": busbw("reduce_scatter_bytes", "reduce_scatter_ms")}
out = {"config": config, "hosts": 2, "steps_timed": len(steps),
       "ops": {op: {"link_busbw_gbs": link[op], "step_busbw_gbs": got[op], "ratio": got[op] / link[op]}
               for op in got}}
if as_json:
    print(json.dumps(out)); sys.exit(0)
print(f"FSDP step communication across 2 namespace hosts (dp 2, {config.rsplit('/', 1)[-1]}), {len(steps)} steps")
print(f"{'op':16} {'link busbw GB/s':>16} {'step busbw GB/s':>16} {'ratio':>7}")
for op, v in out["ops"].items():
    print(f"{op:16} {v['link_busbw_gbs']:16.2f} {v['step_busbw_gbs']:16.2f} {v['ratio']:7.2f}")
PY
