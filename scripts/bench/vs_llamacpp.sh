#!/usr/bin/env bash
# Inference speed: tpr against llama.cpp on one random checkpoint, side by
# side on this machine, as ratios (docs/benchmarks.md, "tpr against llama.cpp").
#
#   scripts/bench/vs_llamacpp.sh [--config configs/minimax_m2_small.json] [--threads 2]
#       [--repeat 3] [--keep median|best] [--dtype bf16|f32|bf16,f32]
#       [--rows p64,p512,d1,d8,d4k] [--tpr-args "..."] [--idle-wait 120] [--retries 2]
#       [--json]
#
# Rows (tok/s; tpr: `tpr bench model --model DIR` with TPR_NUM_THREADS=threads;
# llama.cpp: llama-bench / llama-batched-bench with -t threads):
#   p64, p512  prefill of one 64 / 512-token prompt: tpr --prompt-len P --gen-len 2
#              (prefill_tok_s) | llama-bench -p P -n 0 -b 512 -ub 512 (one ubatch)
#   d1         decode, batch 1, 64 tokens from an empty context: tpr --prompt-len 1
#              --gen-len 64 (decode_tok_s) | llama-bench -p 0 -n 64
#   d8         decode, 8 sequences of 64 prompt + 64 generated tokens, aggregate:
#              tpr --batch 8 --prompt-len 64 --gen-len 64 | llama-batched-bench
#              -npp 64 -ntg 64 -npl 8 (S_TG t/s)
#   d4k        decode of 32 tokens after a 4096-token context: tpr --context 4096
#              --gen-len 32 | llama-bench -d 4096 -p 0 -n 32
# --dtype: bf16 (default): the checkpoint's bf16 weights (tpr --weight-dtype bf16,
# a bf16 GGUF); f32: the same values widened (tpr --weight-dtype f32, an f32 GGUF).
# Each repetition runs every row, tpr then llama.cpp; --keep median (default)
# or best of the --repeat runs per side. The CPUs may be shared: before each
# run the script waits up to --idle-wait seconds (default 120; 0: no wait) for
# them to be at most 10% busy, and meters what other processes used during
# the run; a run where that passed 10% of the CPUs is run again (up to
# --retries times, default 2), marked * in the table and left out of the
# median/best when quieter runs of the same side exist. --tpr-args "..."
# is added to every tpr bench model command line. llama.cpp's flash attention
# (auto), mmap and KV cache type (f16) are its defaults (the report says
# what auto chose).
#
# Set-up, all cached outside the repo in ${TPR_LLAMACPP_CACHE:-~/.cache/tpr-llamacpp}:
# `pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36` (needs
# PyPI), its vendored llama.cpp built with cmake (CPU, GGML_NATIVE, Release,
# llama-bench and llama-batched-bench only; TPR_LLAMACPP_JOBS, default 1).
# The checkpoint: `tpr make-checkpoint --dtype bf16 --seed 1` of --config plus
# the tokenizer of tests/fixtures/demo_model, converted to GGUF by the sdist's
# convert_hf_to_gguf.py (through scripts/bench/llamacpp_convert.py) under
# ${TPR_REFERENCE_PYTHON:-scripts/reference/.venv/bin/python}; gguf-py's
# dependencies missing there (pyyaml, tqdm) are pip-installed
# into it. tpr is build/bin/tpr (or $TPR_BIN). Not in CI: a full run takes
# minutes (--rows for a subset).
set -euo pipefail
cd "$(dirname "$0")/../.."

me=vs_llamacpp.sh
config=configs/minimax_m2_small.json
threads=2
repeat=3
keep=median
dtypes=bf16
rows=p64,p512,d1,d8,d4k
tpr_args=""
idle_wait=120
retries=2
json=0
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
need_arg() { [ $# -ge 2 ] || { echo "$me: $1 needs a value (--help)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --config) need_arg "$@"; config="$2"; shift 2 ;;
    --threads) need_arg "$@"; threads="$2"; shift 2 ;;
    --repeat) need_arg "$@"; repeat="$2"; shift 2 ;;
    --keep) need_arg "$@"; keep="$2"; shift 2 ;;
    --dtype) need_arg "$@"; dtypes="$2"; shift 2 ;;
    --rows) need_arg "$@"; rows="$2"; shift 2 ;;
    --tpr-args) need_arg "$@"; tpr_args="$2"; shift 2 ;;
    --idle-wait) need_arg "$@"; idle_wait="$2"; shift 2 ;;
    --retries) need_arg "$@"; retries="$2"; shift 2 ;;
    --json) json=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "$me: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
for v in idle_wait retries; do
  case "${!v}" in ''|*[!0-9]*) echo "$me: --${v/_/-} needs an integer >= 0, not '${!v}'" >&2; exit 2 ;; esac
done
for v in threads repeat; do
  case "${!v}" in ''|*[!0-9]*) echo "$me: --$v needs a positive integer, not '${!v}'" >&2; exit 2 ;; esac
  [ "${!v}" -ge 1 ] || { echo "$me: --$v needs a positive integer" >&2; exit 2; }
done
case "$keep" in median|best) ;; *) echo "$me: --keep is median or best, not '$keep'" >&2; exit 2 ;; esac
# Comma-separated lists, every item known (an empty item, a trailing comma too, is refused).
[[ "$dtypes" =~ ^(bf16|f32)(,(bf16|f32))*$ ]] ||
  { echo "$me: --dtype: bf16, f32 or bf16,f32, not '$dtypes'" >&2; exit 2; }
[[ "$rows" =~ ^(p64|p512|d1|d8|d4k)(,(p64|p512|d1|d8|d4k))*$ ]] ||
  { echo "$me: --rows: p64, p512, d1, d8, d4k (comma-separated), not '$rows'" >&2; exit 2; }
IFS=, read -ra dtype_list <<< "$dtypes"
IFS=, read -ra row_list <<< "$rows"
read -ra extra <<< "$tpr_args"
[ -f "$config" ] || { echo "$me: no config $config" >&2; exit 2; }

log() { echo "$me: $*" >&2; }
tpr="${TPR_BIN:-build/bin/tpr}"
[ -x "$tpr" ] || { echo "$me: no tpr binary at $tpr: build it (cmake --build build --target tpr_cli) or set TPR_BIN" >&2; exit 1; }

# -- The converter's interpreter (checked first: the build below takes
# minutes): torch, transformers, numpy (the reference venv), plus gguf-py's
# own dependencies, installed into it when missing.
py="${TPR_REFERENCE_PYTHON:-scripts/reference/.venv/bin/python}"
if ! [ -x "$py" ] || ! "$py" -c 'import torch, transformers, numpy' > /dev/null 2>&1; then
  echo "$me: $py cannot import torch, transformers and numpy (make it with" \
       "scripts/reference/setup_venv.sh, or set TPR_REFERENCE_PYTHON)" >&2
  exit 1
fi
missing=()
for m in yaml:pyyaml tqdm:tqdm; do
  "$py" -c "import ${m%%:*}" > /dev/null 2>&1 || missing+=("${m#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing the GGUF converter's dependencies into $py: ${missing[*]}"
  "$py" -m pip install -q "${missing[@]}" >&2 || { echo "$me: pip install ${missing[*]} failed (PyPI needed)" >&2; exit 1; }
fi

# -- llama.cpp, fetched and built once in the cache.
version=0.3.36
cache="${TPR_LLAMACPP_CACHE:-$HOME/.cache/tpr-llamacpp}"
src="$cache/src/llama_cpp_python-$version"
llama="$src/vendor/llama.cpp"
bin="$cache/build-$version/bin"
mkdir -p "$cache"
if [ ! -x "$bin/llama-bench" ] || [ ! -x "$bin/llama-batched-bench" ]; then
  sdist="$cache/sdist/llama_cpp_python-$version.tar.gz"
  if [ ! -f "$sdist" ]; then
    log "downloading the llama-cpp-python $version sdist from PyPI into $cache/sdist"
    if ! python3 -m pip download --no-binary :all: --no-deps "llama-cpp-python==$version" -d "$cache/sdist" >&2 ||
        [ ! -f "$sdist" ]; then
      echo "$me: pip download llama-cpp-python==$version failed: the set-up needs network access to PyPI" \
           "(or put $(basename "$sdist") in $cache/sdist)" >&2
      exit 1
    fi
  fi
  if [ ! -f "$llama/CMakeLists.txt" ]; then
    log "unpacking $sdist"
    if ! { mkdir -p "$cache/src" && tar -xzf "$sdist" -C "$cache/src"; }; then
      echo "$me: could not unpack $sdist" >&2
      exit 1
    fi
  fi
  # CPU only, -march=native (GGML_NATIVE), no network code (curl, OpenSSL),
  # static, only the two benches.
  log "building llama.cpp's llama-bench and llama-batched-bench in $cache/build-$version (-j${TPR_LLAMACPP_JOBS:-1}; minutes)"
  if ! cmake -S "$llama" -B "$cache/build-$version" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF > "$cache/cmake.log" 2>&1 ||
     ! cmake --build "$cache/build-$version" -j"${TPR_LLAMACPP_JOBS:-1}" --target llama-bench llama-batched-bench \
        >> "$cache/cmake.log" 2>&1; then
    echo "$me: building llama.cpp failed; the log is $cache/cmake.log:" >&2
    tail -20 "$cache/cmake.log" >&2
    exit 1
  fi
fi

# -- The checkpoint, in tpr's and llama.cpp's formats.
work=$(mktemp -d "${TMPDIR:-/tmp}/tpr-vs-llamacpp.XXXXXX")
trap 'rm -rf "$work"' EXIT
ckpt="$work/ckpt"
tok=tests/fixtures/demo_model
vocab=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$config")
tok_vocab=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["model"]["vocab"]))' "$tok/tokenizer.json")
[ "$vocab" -ge "$tok_vocab" ] || { echo "$me: $config's vocab_size $vocab is below the fixture tokenizer's $tok_vocab" >&2; exit 2; }
log "writing a random bf16 checkpoint of $config (tpr make-checkpoint --seed 1)"
"$tpr" make-checkpoint --config "$config" --out "$ckpt" --dtype bf16 --seed 1 --files 1 >&2
cp "$tok/tokenizer.json" "$tok/tokenizer_config.json" "$ckpt/"
for d in "${dtype_list[@]}"; do
  log "converting it to GGUF $d (convert_hf_to_gguf.py --outtype $d)"
  if ! "$py" scripts/bench/llamacpp_convert.py "$llama" "$ckpt" --outtype "$d" --outfile "$work/model-$d.gguf" \
      > "$work/convert-$d.log" 2>&1; then
    echo "$me: convert_hf_to_gguf.py failed:" >&2; tail -20 "$work/convert-$d.log" >&2; exit 1
  fi
done

# llama.cpp's flash attention is left at its default (auto); one verbose
# untimed run per GGUF says what auto chose (verbose logging slows the
# timed runs, so they run without it).
fa=""
for d in "${dtype_list[@]}"; do
  "$bin/llama-bench" -m "$work/model-$d.gguf" -t "$threads" -p 8 -n 0 -r 1 --no-warmup -v > /dev/null \
    2> "$work/fa-$d.log" || true
  chose=$(grep -o 'Flash Attention [a-z]*' "$work/fa-$d.log" | tail -1 | sed 's/Flash Attention //' || true)
  fa+="${fa:+, }$d: ${chose:-unknown}"
done

# -- The runs. Every result is a line of $results (JSON). Other people's
# jobs may share the CPUs: each run first waits (up to --idle-wait seconds)
# for a second in which the CPUs are at most 10% busy, and its record says
# how much of the CPUs other processes used while it ran.
results="$work/results.jsonl"
: > "$results"
export TPR_NUM_THREADS="$threads"
quiet() { python3 scripts/bench/vs_llamacpp.py wait-idle --max-wait "$idle_wait" --threshold 0.1; }
metered() { python3 scripts/bench/vs_llamacpp.py run --meter "$work/meter.json" -- "$@"; }
# $1 dtype, $2 row, $3 rep, then the bench model flags: one tpr run.
# $1 dtype, $2 row, $3 rep, $4 tpr, llama-bench or llama-batched-bench, then
# the command: one measurement, run again (up to --retries times) while other
# processes used more than 10% of the CPUs during it; every attempt is kept.
measure() {
  local d=$1 row=$2 rep=$3 tool=$4 attempt busy parse what envp=""
  shift 4
  for attempt in $(seq 0 "$retries"); do
    busy=$(quiet)
    what="run $rep"
    [ "$attempt" -gt 0 ] && what+=", retry $attempt"
    [ "$tool" = tpr ] && envp="TPR_NUM_THREADS=$threads "
    log "[$d $row, $what] $envp$*"
    if ! metered "$@" > "$work/run.out" 2> "$work/run.err"; then
      echo "$me: $tool failed: $*" >&2; tail -20 "$work/run.err" >&2; exit 1
    fi
    if [ "$tool" = tpr ]; then parse=(parse-tpr); else parse=(parse-llama --tool "$tool" --log "$work/run.err"); fi
    python3 scripts/bench/vs_llamacpp.py "${parse[@]}" --dtype "$d" --row "$row" --rep "$rep" \
      --meter "$work/meter.json" --busy-before "$busy" < "$work/run.out" >> "$results"
    python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["others_cpu_fraction"] > 0.1)' \
      "$work/meter.json" && break
    log "  other processes used more than 10% of the CPUs during that run"
  done
}
run_tpr() {  # $1 dtype, $2 row, $3 rep, then bench model's flags
  local d=$1 row=$2 rep=$3
  shift 3
  measure "$d" "$row" "$rep" tpr "$tpr" bench model --model "$ckpt" --weight-dtype "$d" "$@" \
    ${extra[@]+"${extra[@]}"} --json
}
run_llama() {  # $1 dtype, $2 row, $3 rep, $4 llama-bench or llama-batched-bench, then its flags
  local d=$1 row=$2 rep=$3 tool=$4
  shift 4
  measure "$d" "$row" "$rep" "$tool" "$bin/$tool" -m "$work/model-$d.gguf" -t "$threads" "$@"
}
for rep in $(seq "$repeat"); do
  for d in "${dtype_list[@]}"; do
    for row in "${row_list[@]}"; do
      case "$row" in
        p64|p512)
          P=${row#p}
          run_tpr "$d" "$row" "$rep" --prompt-len "$P" --gen-len 2
          run_llama "$d" "$row" "$rep" llama-bench -p "$P" -n 0 -b 512 -ub 512 -r 1 -o json ;;
        d1)
          run_tpr "$d" "$row" "$rep" --prompt-len 1 --gen-len 64
          run_llama "$d" "$row" "$rep" llama-bench -p 0 -n 64 -r 1 -o json ;;
        d8)
          run_tpr "$d" "$row" "$rep" --batch 8 --prompt-len 64 --gen-len 64
          # 8 sequences of 128 tokens in a 1024-row KV cache; each prompt
          # its own (not shared), all 8 prompts in one 512-token ubatch.
          run_llama "$d" "$row" "$rep" llama-batched-bench -npp 64 -ntg 64 -npl 8 -c 1024 -b 512 -ub 512 \
            --output-format jsonl ;;
        d4k)
          run_tpr "$d" "$row" "$rep" --context 4096 --gen-len 32
          run_llama "$d" "$row" "$rep" llama-bench -d 4096 -p 0 -n 32 -r 1 -o json ;;
      esac
    done
  done
done

json_flag=()
[ "$json" = 1 ] && json_flag=(--json)
cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|avx512_vnni|amx_bf16|amx_tile|amx_int8)$' | tr '\n' ' ' || true)
tpr_version=$(git describe --always --dirty 2>/dev/null || echo unknown)
python3 scripts/bench/vs_llamacpp.py report --results "$results" --keep "$keep" --threads "$threads" \
  --repeat "$repeat" --config "$config" --cpu "$cpu" --flags "$flags" --tpr-version "$tpr_version" \
  --llamacpp-python "$version" --llamacpp-fa "$fa" --tpr-args "$tpr_args" ${json_flag[@]+"${json_flag[@]}"}
