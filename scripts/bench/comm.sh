#!/usr/bin/env bash
# tpr bench comm against raw MPI, side by side: for all_gather,
# reduce_scatter and all_reduce (f32 sum) at 1..64 MiB, np 2, each round runs
#   tpr bench comm              (tpr alone, one-iteration blocks)
#   mpi_raw_bench               (scripts/bench/mpi_raw.c: a plain C program,
#                                MPI only, malloc'd buffers, MPI_COMM_WORLD)
#   tpr bench comm --baseline   (tpr's call alternating, in the same process,
#                                with the raw MPI call on buffers of its own)
# with the same sizes, iterations and statistic (the interquartile mean of
# one-iteration blocks), and prints per size the median over rounds of each
# busbw and of the ratios
#   vs base = tpr busbw / in-process baseline busbw (both from --baseline)
#   vs raw  = tpr alone busbw / raw program busbw   (the bar: >= 0.95;
#             (min): the worst round)
# tpr alone, not the --baseline run, is held against the raw program: there
# the two alternate call by call over two sets of buffers, so below ~16 MiB
# (cache-sized: 32 MiB L3 here) each call finds the other's data in the
# cache and both run slower than a program that reuses one set.
#
#   scripts/bench/comm.sh [--np N] [--rounds R] [--iters N] [-b MIN] [-e MAX]
#                         [--ops "all_gather reduce_scatter all_reduce"] [--json]
#
# Defaults: np 2, 3 rounds, 40 iterations, 1M..64M (factor 2). Run it with
# nothing else heavy on the machine: on 2 cores the two ranks take both.
set -euo pipefail
cd "$(dirname "$0")/../.."

np=2
rounds=3
iters=40
minb=1M
maxb=64M
ops="all_gather reduce_scatter all_reduce"
json=0
while [ $# -gt 0 ]; do
  case "$1" in
    --np) np="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    -b) minb="$2"; shift 2 ;;
    -e) maxb="$2"; shift 2 ;;
    --ops) ops="$2"; shift 2 ;;
    --json) json=1; shift ;;
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "comm.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
for v in np rounds iters; do
  case "${!v}" in ''|*[!0-9]*|0) echo "comm.sh: --$v needs a positive integer" >&2; exit 2 ;; esac
done
for op in $ops; do
  case "$op" in all_gather|reduce_scatter|all_reduce) ;; *) echo "comm.sh: unknown op $op" >&2; exit 2 ;; esac
done
tpr=build/bin/tpr
raw=build/bin/mpi_raw_bench
for b in "$tpr" "$raw"; do
  [ -x "$b" ] || { echo "comm.sh: no $b (cmake --build build --target tpr_cli mpi_raw_bench)" >&2; exit 2; }
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

[ "$json" = 1 ] || echo "comm.sh: np $np, $rounds round(s) of $iters iterations, $minb..$maxb: $ops" >&2
for op in $ops; do
  for r in $(seq 1 "$rounds"); do
    [ "$json" = 1 ] || echo "  $op round $r/$rounds ..." >&2
    mpirun -np "$np" --oversubscribe "$tpr" bench comm -o "$op" -b "$minb" -e "$maxb" -f 2 -n "$iters" \
      --blocks "$iters" --json | grep '^{' > "$out/alone.$op.$r"
    mpirun -np "$np" --oversubscribe "$raw" -o "$op" -b "$minb" -e "$maxb" -f 2 -n "$iters" --blocks "$iters" \
      --json | grep '^{' > "$out/raw.$op.$r"
    mpirun -np "$np" --oversubscribe "$tpr" bench comm -o "$op" -b "$minb" -e "$maxb" -f 2 -n "$iters" \
      --baseline --json | grep '^{' > "$out/tpr.$op.$r"
  done
done

python3 - "$out" "$rounds" "$np" "$json" $ops <<'PY'
import json, statistics, sys
out, rounds, np_, as_json, ops = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5:]
def load(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return {r["size"]: r for r in rows if r.get("kind") == "result"}
med = statistics.median
rows = []
for op in ops:
    runs = [(load(f"{out}/alone.{op}.{k}"), load(f"{out}/raw.{op}.{k}"), load(f"{out}/tpr.{op}.{k}"))
            for k in range(1, rounds + 1)]
    for size in sorted(runs[0][0]):
        ok = [k for k in range(len(runs)) if all(size in x for x in runs[k])]
        t = [runs[k][0][size] for k in ok]
        w = [runs[k][1][size] for k in ok]
        bl = [runs[k][2][size] for k in ok]
        rows.append({
            "op": op, "size": size, "ranks": np_, "rounds": len(t),
            "tpr_busbw": med(x["busbw"] for x in t),
            "baseline_busbw": med(x["mpi_busbw"] for x in bl),
            "raw_busbw": med(x["busbw"] for x in w),
            "tpr_time_us": med(x["time_us"] for x in t),
            "raw_time_us": med(x["time_us"] for x in w),
            "vs_baseline": med(x["ratio"] for x in bl),
            "vs_raw": med(w[k]["time_us"] / t[k]["time_us"] for k in range(len(t))),
            "vs_raw_min": min(w[k]["time_us"] / t[k]["time_us"] for k in range(len(t))),
            "wrong": sum(x.get("wrong", 0) for x in t) + sum(x.get("wrong", 0) + x.get("mpi_wrong", 0) for x in bl),
        })
if as_json:
    for r in rows:
        print(json.dumps(r))
    sys.exit(0)
print(f"# tpr bench comm vs raw MPI, np {np_}, f32 sum; medians over {rounds} round(s); ratio = tpr busbw / other busbw")
print(f"# {'op':>14}  {'size (B)':>10}  {'tpr us':>9}  {'raw us':>9}  {'tpr busbw':>9}  {'base busbw':>10}  "
      f"{'raw busbw':>9}  {'vs base':>7}  {'vs raw':>6}  {'(min)':>6}  #wrong")
for r in rows:
    print(f"  {r['op']:>14}  {r['size']:>10}  {r['tpr_time_us']:>9.1f}  {r['raw_time_us']:>9.1f}  "
          f"{r['tpr_busbw']:>9.3f}  {r['baseline_busbw']:>10.3f}  {r['raw_busbw']:>9.3f}  {r['vs_baseline']:>7.3f}  "
          f"{r['vs_raw']:>6.3f}  {r['vs_raw_min']:>6.3f}  {r['wrong']}")
bad = [r for r in rows if r["vs_raw"] < 0.95]
print(f"# sizes below 0.95 x raw: {len(bad)} of {len(rows)}" +
      "".join(f"\n#   {r['op']} {r['size']} B: {r['vs_raw']:.3f}" for r in bad))
PY
