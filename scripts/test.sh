#!/usr/bin/env bash
# Runs the whole test suite (unit, op-vs-reference, program, multi-rank MPI
# and CLI tests) under ctest, after installing dependencies, building and
# checking the layers' includes (scripts/check_layers.sh).
#
#   scripts/test.sh              Release build in build/
#   scripts/test.sh --sanitize   -fsanitize=address,undefined build in build-asan/
#   scripts/test.sh --no-fuzz    skip the fuzz smoke run
#   extra arguments after -- go to ctest (e.g. -- -R test_ops)
#
# The plain suite ends with a fuzz smoke run (scripts/fuzz.sh, 30 s per
# target on the committed corpora, clang installed if missing): any crash,
# sanitizer report, hang or OOM fails it.
#
# GPU tests report "skipped" (not passed) when no CUDA device is present.
set -euo pipefail
cd "$(dirname "$0")/.."

setup_args=()
build_dir=build
label="plain"
ctest_args=()
fuzz=1
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) setup_args+=(--sanitize); build_dir=build-asan; label="sanitized (address,undefined)"; shift ;;
    --no-fuzz) fuzz=0; shift ;;
    --) shift; ctest_args=("$@"); break ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "test.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

scripts/setup.sh --build-dir "$build_dir" "${setup_args[@]}"

# The layer order (scripts/layers.txt): no #include may point up or sideways
# between folders. Cheap, so it runs first.
scripts/check_layers.sh

# test_slurm runs a Slurm cluster of namespace hosts (scripts/cluster/
# slurm_up.sh): Debian's Slurm 22.05, munge and PMIx's tools, installed here
# when missing (no daemon is started by the packages without systemd; the
# test starts its own, in its namespaces).
if [ "$(id -u)" = 0 ] || command -v sudo >/dev/null; then
  slurm_missing=()
  for p in slurmctld slurmd slurm-client munge libpmix-bin; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || slurm_missing+=("$p")
  done
  if [ ${#slurm_missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    echo "test: installing ${slurm_missing[*]} for test_slurm"
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${slurm_missing[@]}"
  fi
fi

# Open MPI refuses root without these; CI machines have 2 cores, so the
# multi-rank tests oversubscribe (set per test in tests/CMakeLists.txt).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "test: running the $label suite"
cd "$build_dir"
ctest --output-on-failure --timeout 600 -j 2 "${ctest_args[@]}"

if [ "$fuzz" = 1 ] && [ "$build_dir" = build ] && [ ${#ctest_args[@]} -eq 0 ]; then
  cd ..
  # libFuzzer's runtime (libclang-rt-N-dev) is only a Recommends of clang:
  # check that clang links a fuzzer, and install with recommends if not.
  probe=$(mktemp -d)
  echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' > "$probe/p.c"
  if ! clang -fsanitize=fuzzer "$probe/p.c" -o "$probe/p" > /dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    echo "test: installing clang (with libFuzzer) for the fuzz smoke run"
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang
  fi
  rm -rf "$probe"
  echo "test: fuzz smoke run (30 s per target)"
  scripts/fuzz.sh --seconds 30 --jobs 2
fi
