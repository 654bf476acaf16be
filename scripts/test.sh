#!/usr/bin/env bash
# Runs the whole test suite (unit, op-vs-reference, program, multi-rank MPI
# and CLI tests) under ctest, after installing dependencies and building.
#
#   scripts/test.sh              Release build in build/
#   scripts/test.sh --sanitize   -fsanitize=address,undefined build in build-asan/
#   extra arguments after -- go to ctest (e.g. -- -R test_ops)
#
# GPU tests report "skipped" (not passed) when no CUDA device is present.
set -euo pipefail
cd "$(dirname "$0")/.."

setup_args=()
build_dir=build
label="plain"
ctest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) setup_args+=(--sanitize); build_dir=build-asan; label="sanitized (address,undefined)"; shift ;;
    --) shift; ctest_args=("$@"); break ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "test.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

scripts/setup.sh --build-dir "$build_dir" "${setup_args[@]}"

# Open MPI refuses root without these; CI machines have 2 cores, so the
# multi-rank tests oversubscribe (set per test in tests/CMakeLists.txt).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "test: running the $label suite"
cd "$build_dir"
ctest --output-on-failure --timeout 600 -j 2 "${ctest_args[@]}"
