#!/usr/bin/env bash
# ctest: tpr under Slurm on a cluster of namespace hosts (slurm_up.sh, 2
# nodes, a tag and directory of this run's own, always taken down).
#
#   scripts/cluster/test_slurm.sh TPR_BINARY
#
# Checks, in order:
#   1. srun --mpi=pmix -N 2 --ntasks-per-node 2 puts ranks 0,1 on node 1 and
#      2,3 on node 2 (namespace and hostname), and MPI sees 4 ranks;
#   2. `sbatch --wait scripts/slurm/train.sbatch` (srun --mpi=pmix, tp 2 x dp
#      2, --save-every) gives the --json losses and a model.safetensors
#      bit-identical (tolerance 0) to `mpirun -np 4` on one host, and so does
#      the script with TPR_LAUNCH=mpirun (mpirun inside the allocation);
#   3. faults: the same job, node 2's slurmd, slurmstepd and ranks killed
#      with SIGKILL once a checkpoint is written: the job leaves RUNNING
#      (requeued by Slurm) within FAIL_BOUND_S; with node 2 back
#      (slurm_up.sh again) the requeued job resumes from its last checkpoint
#      and ends with weights bit-identical to the uninterrupted run's;
#   4. serve.sbatch (srun, tp 2 across the nodes) answers a greedy 24-token
#      completion (ignore_eos) of a random prompt with the text of `tpr run`'s
#      24 tokens on the prompt's ids; `scancel` with a request in
#      flight drains it (all its tokens, finish_reason "length") and the job
#      ends CANCELLED;
#   5. negative control: a run with another --lr must fail the comparisons;
#   6. slurm_down.sh leaves no process, namespace or file of the cluster.
# Exit 77 (skipped) where namespaces cannot be made or Slurm cannot be
# installed, or mpirun / python3 are missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
fix="$root/tests/fixtures"
[ $# -ge 1 ] || { echo "usage: test_slurm.sh TPR_BINARY" >&2; exit 2; }
tpr="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
[ -x "$tpr" ] || { echo "test_slurm.sh: $1 is not an executable" >&2; exit 2; }
command -v mpirun >/dev/null 2>&1 || { echo "skipped: mpirun (Open MPI) is not installed"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "skipped: python3 is not installed (the comparisons)"; exit 77; }

FAIL_BOUND_S=45  # kill -> job out of RUNNING: SlurmdTimeout 10 s + the controller's ping and requeue
export TPR_CLUSTER_TAG="tprs$$"
tmp="$(mktemp -d /tmp/tpr_slurm_XXXXXX)"
export TPR_SLURM_DIR="$tmp/cluster"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TPR_NUM_THREADS="${TPR_NUM_THREADS:-1}"
cleanup() { "$here/slurm_down.sh" >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() {
  echo "FAIL: $*"
  for f in "$tmp"/*.out "$TPR_SLURM_DIR"/log/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }; done
  exit 1
}
S() { "$here/slurm.sh" "$@"; }
job_state() { S scontrol show job -o "$1" 2>/dev/null | sed -n 's/.*JobState=\([^ ]*\).*/\1/p'; }
wait_state() {  # JOB SECONDS STATE-REGEX: until the job's state matches
  local t
  for ((t = 0; t < $2 * 4; t++)); do
    [[ "$(job_state "$1")" =~ ^($3)$ ]] && return 0
    sleep 0.25
  done
  return 1
}

rc=0
"$here/slurm_up.sh" --nodes 2 >"$tmp/up.log" 2>&1 || rc=$?
if [ "$rc" = 77 ]; then cat "$tmp/up.log"; exit 77; fi
[ "$rc" = 0 ] || { cat "$tmp/up.log"; fail "slurm_up.sh --nodes 2 exited $rc"; }
sed -n 1,3p "$tmp/up.log"
export TPR_NET=10.77.0.0/24 TPR="$tpr"
cd "$tmp"

# 1. where srun puts the ranks
S srun --mpi=pmix -N 2 --ntasks-per-node 2 sh -c 'echo "$SLURM_PROCID $(ip netns identify $$) $(hostname)"' |
  sort -n >"$tmp/where" || fail "srun -N 2 --ntasks-per-node 2"
echo "ranks (rank, netns, hostname):"; sed 's/^/  /' "$tmp/where"
n1="$TPR_CLUSTER_TAG-h1" n2="$TPR_CLUSTER_TAG-h2"
want=$(printf '%s\n' "0 $n1 $n1" "1 $n1 $n1" "2 $n2 $n2" "3 $n2 $n2")
[ "$(cat "$tmp/where")" = "$want" ] || fail "ranks are not on the expected nodes"
S srun --mpi=pmix -N 2 --ntasks-per-node 2 "$tpr" bench comm -o all_reduce -b 65536 -e 65536 -w 1 -n 1 -c 1 \
  >"$tmp/comm.out" 2>&1 || fail "tpr bench comm under srun --mpi=pmix: $(tail -n 5 "$tmp/comm.out")"
grep -q "4 rank(s)" "$tmp/comm.out" || fail "MPI under srun --mpi=pmix does not see 4 ranks: $(head -n 2 "$tmp/comm.out")"
grep -q "Out of bounds values : 0 OK" "$tmp/comm.out" || fail "all_reduce across the nodes gave wrong values"
echo "srun --mpi=pmix: 4 ranks in one MPI world, all_reduce across the nodes correct"

# 2. training through sbatch against one host
steps=12 every=4
export TPR_MODEL="$fix/minimax_m2_tiny" TPR_SAVE_EVERY="$every"
common="--data $fix/minimax_m2_train/tokens.npy --data-order sequential --seq-len 16 --steps $steps --tp 2 --dp 2 --json"
export TPR_TRAIN_ARGS="$common --lr 1e-3"
# shellcheck disable=SC2086
mpirun -np 4 --oversubscribe --bind-to none "$tpr" train --model "$TPR_MODEL" $TPR_TRAIN_ARGS --save "$tmp/one" \
  >"$tmp/one.jsonl" || { cat "$tmp/one.jsonl"; fail "tpr train on one host"; }
t0=$(date +%s.%N)
TPR_CKPT="$tmp/ck_two" S sbatch --wait -o "$tmp/two.out" "$root/scripts/slurm/train.sbatch" >/dev/null ||
  fail "sbatch --wait train.sbatch"
echo "sbatch --wait train.sbatch: $(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$t0" "$(date +%s.%N)") s"
python3 "$here/compare.py" losses "$tmp/two.out" "$tmp/one.jsonl" --tol 0 || fail "losses of the sbatch run differ"
python3 "$here/compare.py" params "$tmp/ck_two/model.safetensors" "$tmp/one/model.safetensors" --tol 0 ||
  fail "saved parameters of the sbatch run differ"

# The same job with mpirun inside the allocation in place of srun --mpi=pmix
# (Open MPI takes the nodes from Slurm and starts its daemons with srun).
jid=$(TPR_LAUNCH=mpirun TPR_CKPT="$tmp/ck_mpirun" S sbatch --parsable -o "$tmp/mpirun.out" "$root/scripts/slurm/train.sbatch")
wait_state "$jid" 180 'COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY' || fail "mpirun job $jid did not end in 180 s"
[ "$(job_state "$jid")" = COMPLETED ] || fail "train.sbatch with TPR_LAUNCH=mpirun ended $(job_state "$jid")"
echo "TPR_LAUNCH=mpirun (mpirun inside the allocation):"
python3 "$here/compare.py" params "$tmp/ck_mpirun/model.safetensors" "$tmp/one/model.safetensors" --tol 0 ||
  fail "saved parameters of the mpirun run differ"

# 3. a node dies mid-training; the requeued job resumes from its checkpoint
# Every save of this job pauses 1.5 s before it writes the model (a debug
# hook of tpr train; the weights are untouched): the kill below, right after
# the first checkpoint appears, lands before the job can end on any machine.
jid=$(TPR_DEBUG_SAVE_PAUSE_MS=1500 TPR_CKPT="$tmp/ck_fault" S sbatch --parsable -o "$tmp/fault.out" "$root/scripts/slurm/train.sbatch")
ck_step() { sed -n 's/.*"step":[[:space:]]*\([0-9]*\).*/\1/p' "$tmp/ck_fault/trainer_state.json" 2>/dev/null | head -1; }
for ((t = 0; t < 600; t++)); do [ "$(ck_step)" ] && break; sleep 0.2; done
[ "$(ck_step)" ] || fail "job $jid wrote no checkpoint in 120 s"
[ "$(job_state "$jid")" = RUNNING ] || fail "job $jid is not running at the first checkpoint ($(job_state "$jid"))"
killed_at=$(ck_step)
t0=$(date +%s.%N)
# shellcheck disable=SC2046
kill -KILL $(ip netns pids "$n2") 2>/dev/null || true
echo "killed node 2 (slurmd, slurmstepd, ranks 2 and 3) after the checkpoint of step $killed_at"
wait_state "$jid" "$FAIL_BOUND_S" 'PENDING|REQUEUED|REQUEUE_FED|REQUEUE_HOLD|CONFIGURING' ||
  fail "job $jid still $(job_state "$jid") $FAIL_BOUND_S s after node 2 died"
dt=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$t0" "$(date +%s.%N)")
echo "job $jid requeued $dt s after the kill (bound $FAIL_BOUND_S s); node 2: $(S sinfo -h -n "$n2" -o %t)"
[ "$(ck_step)" -lt "$steps" ] || fail "the run had ended before the kill: nothing to resume"
"$here/slurm_up.sh" --nodes 2 >/dev/null || fail "slurm_up.sh could not bring node 2 back"
wait_state "$jid" 180 'COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY' || fail "requeued job $jid did not end in 180 s"
[ "$(job_state "$jid")" = COMPLETED ] || fail "requeued job $jid ended $(job_state "$jid")"
grep -q "restart 1 " "$tmp/fault.out" || fail "job $jid did not run a second time (SLURM_RESTART_COUNT 1)"
grep -q "resuming from $tmp/ck_fault" "$tmp/fault.out" || fail "the requeued job did not resume from its checkpoint"
! sed -n '/restart 1 /,$p' "$tmp/fault.out" | grep -q 'tpr train exited' ||
  fail "the requeued job's first run failed (a dead step's leftovers on the node brought back?)"
echo "the job's own account:"; grep '^train.sbatch' "$tmp/fault.out" | sed 's/^/  /'
echo "killed at $(date -d "@${t0%.*}" +%T)"
python3 "$here/compare.py" params "$tmp/ck_fault/model.safetensors" "$tmp/one/model.safetensors" --tol 0 ||
  fail "the resumed run's weights differ from the uninterrupted run's"

# 4. serving under srun, and scancel's drain
seed="${TPR_TEST_SEED:-$RANDOM}"
words=(hello world the model tokens stream chat batch engine node rank cluster)
prompt="${words[seed % 12]} ${words[(seed / 12) % 12]} ${words[(seed / 144) % 12]}"
echo "seed $seed, prompt '$prompt'"
sjid=$(TPR_MODEL="$fix/demo_model" TPR_PORT=0 TPR_ENDPOINT="$tmp/url" TPR_SERVE_ARGS="--tp 2" \
  S sbatch --parsable -o "$tmp/serve.out" "$root/scripts/slurm/serve.sbatch")
for ((t = 0; t < 240; t++)); do [ -s "$tmp/url" ] && break; sleep 0.25; done
[ -s "$tmp/url" ] || fail "serve job $sjid did not listen within 60 s"
url=$(cat "$tmp/url")
body() {  # PROMPT MAX_TOKENS IGNORE_EOS(0|1)
  python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "max_tokens": int(sys.argv[2]), "temperature": 0, "ignore_eos": sys.argv[3] == "1"}))' "$@"
}
# 24 tokens whatever EOS says (ignore_eos), against `tpr run` on the prompt's
# ids (no EOS stop with ids) decoded without the special tokens, as serve does.
S curl -sf -m 60 "$url/v1/completions" -H 'Content-Type: application/json' -d "$(body "$prompt" 24 1)" >"$tmp/answer.json" ||
  fail "no answer from $url"
ids=$("$tpr" tokenize --model "$fix/demo_model" --text "$prompt") || fail "tpr tokenize"
TPR_NUM_THREADS=1 "$tpr" run --model "$fix/demo_model" --prompt-ids "$ids" --max-new-tokens 24 --json 2>/dev/null |
  grep '^{"command"' >"$tmp/run.json" || fail "tpr run"
gen=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompts"][0]["generated"])))' "$tmp/run.json")
"$tpr" detokenize --model "$fix/demo_model" --ids "$gen" --skip-special >"$tmp/run.txt" || fail "tpr detokenize"
python3 - "$tmp/answer.json" "$tmp/run.txt" <<'PY' || fail "the served answer differs from tpr run's"
import json, sys
c = json.load(open(sys.argv[1]))
a, n = c["choices"][0]["text"], c["usage"]["completion_tokens"]
b = open(sys.argv[2], encoding="utf-8").read()
b = b[:-1] if b.endswith("\n") else b  # detokenize ends its line
print(f"served ({n} tokens) {a!r}\ntpr run {b!r}")
sys.exit(not (n == 24 and a == b))
PY
# A long request in flight, then scancel: it must be answered whole.
(S curl -s -m 120 "$url/v1/completions" -H 'Content-Type: application/json' -d "$(body "$prompt" 1000 1)" >"$tmp/long.json") &
curl_pid=$!
for ((t = 0; t < 100; t++)); do
  S curl -s -m 5 "$url/metrics" | grep -Eq '^tpr_running_sequences(\{[^}]*\})? [1-9]' && break
  sleep 0.1
done
S scancel "$sjid"
wait "$curl_pid" || fail "the in-flight request failed after scancel"
python3 - "$tmp/long.json" <<'PY' || fail "the in-flight request was not drained whole"
import json, sys
c = json.load(open(sys.argv[1]))
ch, u = c["choices"][0], c["usage"]
print(f"in flight at scancel: {u['completion_tokens']} tokens, finish_reason {ch['finish_reason']}")
sys.exit(not (u["completion_tokens"] == 1000 and ch["finish_reason"] == "length"))
PY
wait_state "$sjid" 60 'CANCELLED' || fail "serve job $sjid is $(job_state "$sjid") after scancel"
grep -q "finishing the in-flight requests" "$tmp/serve.out" || fail "rank 0 did not drain"
echo "scancel: the request in flight was finished, job $sjid CANCELLED"

# 5. negative control
# shellcheck disable=SC2086
mpirun -np 4 --oversubscribe --bind-to none "$tpr" train --model "$TPR_MODEL" $common --lr 2e-3 --save "$tmp/neg" \
  >"$tmp/neg.jsonl" || fail "tpr train (negative control)"
echo "negative control (--lr 2e-3 against the sbatch runs):"
! python3 "$here/compare.py" losses "$tmp/two.out" "$tmp/neg.jsonl" --tol 0 || fail "losses comparison cannot fail"
! python3 "$here/compare.py" params "$tmp/ck_fault/model.safetensors" "$tmp/neg/model.safetensors" --tol 0 ||
  fail "parameter comparison cannot fail"

# 6. down leaves nothing
cd /
"$here/slurm_down.sh" || fail "slurm_down.sh"
left=$(ip netns list | awk '{print $1}' | grep -c "^$TPR_CLUSTER_TAG-" || true)
[ "$left" = 0 ] || fail "$left namespaces of $TPR_CLUSTER_TAG left"
[ ! -e "$TPR_SLURM_DIR" ] || fail "$TPR_SLURM_DIR left"
if pgrep -f -- "$TPR_SLURM_DIR" >/dev/null; then fail "processes of the cluster left: $(pgrep -af -- "$TPR_SLURM_DIR")"; fi
echo "PASS: srun --mpi=pmix and sbatch train 2 nodes x 2 ranks bit for bit as 1 host; a killed node's job is requeued and resumes to the same weights; serve answers under srun and drains on scancel"
