#!/usr/bin/env bash
# Inference speed: tpr against Hugging Face transformers (eager, float32) on
# one random checkpoint, side by side in one run.
#
#   scripts/bench/vs_transformers.sh [--prompt-len 64] [--gen-len 32] [--threads 2]
#                                    [--config configs/minimax_m2_small.json]
#                                    [--runs 2] [--no-tp2] [--json]
#
# Writes a bf16 checkpoint of --config with `tpr make-checkpoint` (as real
# checkpoints are), then measures prefill and decode tokens/s of
#   (a) transformers' MiniMaxM2ForCausalLM, float32, torch.set_num_threads(threads),
#       greedy generate (scripts/bench/vs_transformers.py torch),
#   (b) tpr bench model --model DIR with TPR_NUM_THREADS=threads, weights
#       held in bf16 (as the checkpoint has them) and widened to f32,
#   (c) the same under mpirun -np 2 (tp 2), one thread per rank
#       (skipped by --no-tp2),
# best of --runs each, and prints a table with tpr / transformers ratios
# (--json: one object). transformers runs in scripts/reference/.venv (made by
# scripts/reference/setup_venv.sh if missing), or $TPR_REFERENCE_PYTHON;
# without it the script fails.
set -euo pipefail
cd "$(dirname "$0")/../.."

config=configs/minimax_m2_small.json
prompt=64
gen=32
threads=2
runs=2
tp2=1
json=0
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config="$2"; shift 2 ;;
    --prompt-len) prompt="$2"; shift 2 ;;
    --gen-len) gen="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --no-tp2) tp2=0; shift ;;
    --json) json=1; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "vs_transformers.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
for v in prompt gen threads runs; do
  case "${!v}" in ''|*[!0-9]*) echo "vs_transformers.sh: --$v needs a positive integer" >&2; exit 2 ;; esac
  [ "${!v}" -ge 1 ] || { echo "vs_transformers.sh: --$v needs a positive integer" >&2; exit 2; }
done
[ -f "$config" ] || { echo "vs_transformers.sh: no config $config" >&2; exit 2; }

log() { if [ "$json" = 1 ]; then echo "$*" >&2; else echo "$*"; fi; }

if [ ! -x build/bin/tpr ]; then
  log "vs_transformers.sh: build/bin/tpr missing, running scripts/setup.sh --build-dir build"
  scripts/setup.sh --build-dir build >&2
fi

# The reference interpreter: it must import transformers' MiniMax-M2 class.
py="${TPR_REFERENCE_PYTHON:-scripts/reference/.venv/bin/python}"
has_hf() { [ -x "$py" ] && "$py" -c 'import torch; from transformers import MiniMaxM2ForCausalLM' >/dev/null 2>&1; }
if ! has_hf; then
  if [ -n "${TPR_REFERENCE_PYTHON:-}" ]; then
    echo "vs_transformers.sh: TPR_REFERENCE_PYTHON=$py cannot import torch and transformers' MiniMaxM2ForCausalLM" >&2
    exit 1
  fi
  log "vs_transformers.sh: making the reference venv (bash scripts/reference/setup_venv.sh; torch from PyPI)"
  if ! bash scripts/reference/setup_venv.sh >&2 || ! has_hf; then
    echo "vs_transformers.sh: could not make the reference venv scripts/reference/.venv (see above);" \
         "transformers is the baseline, so there is nothing to compare against" >&2
    exit 1
  fi
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/tpr-vs-transformers.XXXXXX")
trap 'rm -rf "$work"' EXIT
ckpt="$work/ckpt"
log "vs_transformers.sh: writing a random bf16 checkpoint of $config"
build/bin/tpr make-checkpoint --config "$config" --out "$ckpt" --dtype bf16 --seed 1 >&2
results="$work/results.jsonl"
printf '{"engine":"meta","config":"%s","prompt_len":%d,"gen_len":%d,"threads":%d,"runs":%d}\n' \
  "$config" "$prompt" "$gen" "$threads" "$runs" > "$results"

log "  transformers: float32, eager attention, $threads threads, warm-up then $runs timed generates"
if ! "$py" scripts/bench/vs_transformers.py torch --model "$ckpt" --prompt-len "$prompt" --gen-len "$gen" \
    --threads "$threads" --runs "$runs" > "$work/hf.out" 2> "$work/hf.err"; then
  echo "vs_transformers.sh: the transformers run failed:" >&2; tail -20 "$work/hf.err" >&2; exit 1
fi
grep '^{' "$work/hf.out" | tail -1 >> "$results"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# $1 label, $2 ranks, $3 threads per rank, $4 --weight-dtype: the best of $runs bench runs.
run_tpr() {
  local launch=() best="" i
  [ "$2" -gt 1 ] && launch=(mpirun -np "$2" --oversubscribe -x TPR_NUM_THREADS)
  for i in $(seq "$runs"); do
    log "  $1: ${launch[*]:+${launch[*]} }tpr bench model (TPR_NUM_THREADS=$3), run $i"
    if ! TPR_NUM_THREADS=$3 "${launch[@]}" build/bin/tpr bench model --model "$ckpt" --prompt-len "$prompt" \
        --gen-len "$gen" --weight-dtype "$4" --json > "$work/tpr.out" 2> "$work/tpr.err"; then
      echo "vs_transformers.sh: tpr bench model ($1) failed:" >&2; tail -20 "$work/tpr.err" >&2; exit 1
    fi
    grep '^{' "$work/tpr.out" | tail -1 >> "$work/tpr.runs"
  done
  python3 - "$1" "$2" "$3" "$work/tpr.runs" >> "$results" <<'EOF'
import json, sys
label, ranks, thr, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
runs = [json.loads(l) for l in open(path)]
print(json.dumps({"engine": "tpr", "label": label, "ranks": ranks, "threads_per_rank": thr,
                  "prefill_tok_s": max(r["prefill_tok_s"] for r in runs),
                  "decode_tok_s": max(r["decode_tok_s"] for r in runs),
                  "runs": [{k: r[k] for k in ("prefill_tok_s", "decode_tok_s", "machine_read_gbs_per_rank",
                                              "machine_gemm_gflops_per_rank", "peak_rss_bytes_max")} for r in runs]}))
EOF
  rm -f "$work/tpr.runs"
}
# bf16 weights as the checkpoint holds them (auto), and widened to f32 (the
# same values transformers multiplies).
run_tpr "tpr tp 1 ($threads thr), bf16 weights" 1 "$threads" bf16
run_tpr "tpr tp 1 ($threads thr), f32 weights" 1 "$threads" f32
if [ "$tp2" = 1 ]; then
  run_tpr "tpr tp 2 (mpirun -np 2, 1 thr each), bf16" 2 1 bf16
  run_tpr "tpr tp 2 (mpirun -np 2, 1 thr each), f32" 2 1 f32
fi

python3 scripts/bench/vs_transformers.py report --results "$results" $([ "$json" = 1 ] && echo --json)
