#!/usr/bin/env bash
# Training throughput: tpr against PyTorch eager, side by side in one run.
#
#   scripts/bench/train.sh [--config F] [--seq-len T] [--steps S] [--np N]
#                          [--threads N] [--json] [--skip-torch]
#
# Defaults: configs/minimax_m2_small.json, T 256, S 4 (the first a warm-up),
# 1 rank, 2 threads in all (each rank gets threads/np, at least 1). Writes a
# random <i4 token file, then runs tpr train --random-init --profile and
# scripts/bench/train_torch.py alternately, tpr, torch, tpr, torch, and keeps
# the better run of each (the machine is shared and noisy). Peak RSS comes
# from /usr/bin/time -v around every rank. The PyTorch interpreter is
# $TPR_REFERENCE_PYTHON, else scripts/reference/.venv/bin/python.
set -euo pipefail
cd "$(dirname "$0")/../.."

config=configs/minimax_m2_small.json
seq_len=256
steps=4
np=1
threads=2
json=0
skip_torch=0
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config="$2"; shift 2 ;;
    --seq-len) seq_len="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --np) np="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --json) json=1; shift ;;
    --skip-torch) skip_torch=1; shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "train.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
for v in seq_len steps np threads; do
  case "${!v}" in ''|*[!0-9]*) echo "train.sh: --${v//_/-} needs a positive integer" >&2; exit 2 ;; esac
  [ "${!v}" -ge 1 ] || { echo "train.sh: --${v//_/-} needs a positive integer" >&2; exit 2; }
done
[ "$steps" -ge 2 ] || { echo "train.sh: --steps must be at least 2 (the first is a warm-up)" >&2; exit 2; }
[ -f "$config" ] || { echo "train.sh: no config $config" >&2; exit 2; }

log() { if [ "$json" = 1 ]; then echo "$*" >&2; else echo "$*"; fi; }

if [ ! -x build/bin/tpr ]; then
  log "train.sh: build/bin/tpr missing, running scripts/setup.sh --build-dir build"
  scripts/setup.sh --build-dir build >&2
fi
if [ ! -x /usr/bin/time ]; then
  log "train.sh: installing the Debian package time (for /usr/bin/time -v)"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time >&2
fi

torch_py="${TPR_REFERENCE_PYTHON:-scripts/reference/.venv/bin/python}"
torch_note=""
if [ "$skip_torch" = 1 ]; then
  torch_note="skipped (--skip-torch)"
elif [ ! -x "$torch_py" ]; then
  torch_note="no $torch_py: the baseline needs 'bash scripts/reference/setup_venv.sh'"
  log "train.sh: $torch_note; reporting tpr alone"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/tpr-bench-train.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Random token ids in [0, vocab): enough windows of T+1 for every rank and step.
vocab=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$config")
python3 scripts/bench/random_tokens.py "$work/tokens.npy" "$(( (steps * np + 1) * seq_len + 1 ))" "$vocab"

per_rank=$(( threads / np )); [ "$per_rank" -ge 1 ] || per_rank=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
launch=()
[ "$np" -gt 1 ] && launch=(mpirun -np "$np" --oversubscribe -x TPR_NUM_THREADS)

run_tpr() {  # $1: run index; each rank's /usr/bin/time -v goes to rss.$1.RANK
  log "  tpr run $1: ${launch[*]:+${launch[*]} }build/bin/tpr train ... (TPR_NUM_THREADS=$per_rank)"
  if ! TPR_NUM_THREADS=$per_rank "${launch[@]}" \
      sh -c 'exec /usr/bin/time -v -o "$0.${OMPI_COMM_WORLD_RANK:-0}" "$@"' "$work/rss.$1" \
      build/bin/tpr train --config "$config" --random-init --data "$work/tokens.npy" \
      --seq-len "$seq_len" --steps "$steps" --profile --json \
      > "$work/tpr.$1.out" 2> "$work/tpr.$1.err"; then
    echo "train.sh: tpr train failed:" >&2; cat "$work/tpr.$1.err" >&2; exit 1
  fi
}
run_torch() {
  log "  torch run $1: train_torch.py --threads $threads --warmup 1 --steps $(( steps - 1 ))"
  if ! "$torch_py" scripts/bench/train_torch.py --config "$config" --seq-len "$seq_len" \
      --threads "$threads" --warmup 1 --steps $(( steps - 1 )) --json \
      > "$work/torch.$1.out" 2> "$work/torch.$1.err"; then
    echo "train.sh: train_torch.py failed:" >&2; tail -5 "$work/torch.$1.err" >&2
    torch_note="train_torch.py failed (see above)"
  fi
}

log "train.sh: $config, seq-len $seq_len, $steps steps (first is warm-up), $np rank(s), $threads threads;"
if [ -z "$torch_note" ]; then
  log "  tpr and torch alternate (tpr, torch, tpr, torch), best of 2 each: this machine is shared and noisy"
else
  log "  tpr twice, best of 2 kept: this machine is shared and noisy"
fi
for i in 1 2; do
  run_tpr "$i"
  if [ -z "$torch_note" ]; then run_torch "$i"; fi
done

python3 - "$work" "$json" "$torch_note" "$config" "$seq_len" "$steps" "$np" "$threads" "$per_rank" <<'EOF'
import glob, json, os, re, sys
work, as_json, torch_note = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
config, T, steps, np_, threads, per_rank = sys.argv[4], *map(int, sys.argv[5:10])

def rss_mib(i):  # per rank, from /usr/bin/time -v ("Maximum resident set size (kbytes)")
    out = {}
    for p in glob.glob(f"{work}/rss.{i}.*"):
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(p).read())
        if m:
            out[int(p.rsplit(".", 1)[1])] = int(m.group(1)) / 1024.0
    return [out[r] for r in sorted(out)]

tpr_runs = []
for i in (1, 2):
    lines = [l for l in open(f"{work}/tpr.{i}.out") if l.startswith("{")]
    summ = [json.loads(l)["summary"] for l in lines if l.startswith('{"summary"')]
    if not summ:
        sys.exit(f"train.sh: no summary line in tpr run {i}'s output")
    tpr_runs.append({"summary": summ[-1], "steps": [json.loads(l) for l in lines if l.startswith('{"step"')],
                     "rss_mib": rss_mib(i)})
torch_runs = []
if not torch_note:
    for i in (1, 2):
        try:
            torch_runs.append(json.loads(open(f"{work}/torch.{i}.out").read().strip().splitlines()[-1]))
        except (OSError, ValueError, IndexError):
            pass
    if not torch_runs:
        torch_note = "train_torch.py gave no result"

tpr = max(tpr_runs, key=lambda r: r["summary"]["tokens_per_s"])
s = tpr["summary"]
torch = max(torch_runs, key=lambda r: r["tokens_per_s"]) if torch_runs else None
ratio = s["tokens_per_s"] / torch["tokens_per_s"] if torch else None
ops = sorted(s["ops"].items(), key=lambda kv: -kv[1])
total = s.get("program_s") or sum(s["ops"].values()) or 1.0
top = [{"op": k, "s": v, "share": v / total} for k, v in ops[:5]]

if as_json:
    print(json.dumps({
        "bench": "train", "config": config, "seq_len": T, "steps": steps, "warmup_steps": 1,
        "np": np_, "threads": threads, "threads_per_rank": per_rank,
        "selection": "better (higher tokens/s) of 2 alternating runs per engine: tpr, torch, tpr, torch",
        "peak_rss_source": "/usr/bin/time -v per rank (Maximum resident set size)",
        "tpr": {"tokens_per_s": s["tokens_per_s"], "ms_per_step": s["ms_per_step"],
                "peak_rss_mib": max(tpr["rss_mib"]) if tpr["rss_mib"] else None,
                "peak_rss_mib_per_rank": tpr["rss_mib"],
                "gemm_gflops": s["gemm_gflops"], "sgemm_gflops": s["sgemm_gflops"],
                "gemm_efficiency": s["gemm_efficiency"], "top_ops": top, "summary": s,
                "runs_tokens_per_s": [r["summary"]["tokens_per_s"] for r in tpr_runs]},
        "torch": None if not torch else {
                "tokens_per_s": torch["tokens_per_s"], "ms_per_step": torch["ms_per_step_mean"],
                "peak_rss_mib": torch["peak_rss_mib"], "threads": torch["threads"],
                "versions": torch.get("versions"),
                "runs_tokens_per_s": [r["tokens_per_s"] for r in torch_runs]},
        "torch_note": torch_note or None,
        "ratio_vs_torch": ratio,
    }))
    sys.exit(0)

def fmt_rss(v):
    return "-" if not v else (f"{max(v):.0f} MiB" + (" (max of ranks)" if len(v) > 1 else ""))

rows = [("engine", "tokens/s", "ms/step", "peak RSS", "ratio vs torch")]
rows.append((f"tpr ({np_} rank{'s' if np_ > 1 else ''} x {per_rank} thr)", f"{s['tokens_per_s']:.1f}",
             f"{s['ms_per_step']:.1f}", fmt_rss(tpr["rss_mib"]),
             f"{ratio:.2f}x" if ratio else "unavailable"))
if torch:
    rows.append((f"torch eager ({torch['threads']} thr)", f"{torch['tokens_per_s']:.1f}",
                 f"{torch['ms_per_step_mean']:.1f}", f"{torch['peak_rss_mib']:.0f} MiB", "1.00x"))
w = [max(len(r[c]) for r in rows) for c in range(5)]
print()
for j, r in enumerate(rows):
    print(" | ".join(x.ljust(w[c]) if c == 0 else x.rjust(w[c]) for c, x in enumerate(r)))
    if j == 0:
        print("-+-".join("-" * n for n in w))
if not torch:
    print(f"torch: {torch_note}")
print(f"\ntpr runs (tokens/s): {', '.join('%.1f' % r['summary']['tokens_per_s'] for r in tpr_runs)}"
      + (f"; torch runs: {', '.join('%.1f' % r['tokens_per_s'] for r in torch_runs)}" if torch_runs else "")
      + " (best of each kept)")
print(f"tpr GEMMs: {s['gemm_gflops']:.1f} GFLOP/s = {100 * s['gemm_efficiency']:.0f}% of sgemm "
      f"({s['sgemm_gflops']:.1f} GFLOP/s measured in the same run, rank 0)")
print("tpr top op kinds (rank 0 program time): "
      + ", ".join(f"{t['op']} {t['s']:.2f} s ({100 * t['share']:.0f}%)" for t in top))
print("peak RSS: /usr/bin/time -v per rank for tpr; ru_maxrss of the process for torch")
EOF
