#!/usr/bin/env bash
# Installs tpr's system dependencies (Debian packages) and builds it.
#
#   scripts/setup.sh [--build-dir DIR] [--sanitize] [--debug] [--no-build]
#
# Idempotent: packages already installed are not reinstalled (apt-get update
# runs first whenever something is missing), and the build is incremental.
# TPR_CUDA=AUTO|ON|OFF (default AUTO: build the CUDA backend when nvcc is
# found on PATH or in /usr/local/cuda/bin).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
build_type=Release
sanitize=OFF
do_build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --sanitize) sanitize=ON; build_type=RelWithDebInfo; shift ;;
    --debug) build_type=Debug; shift ;;
    --no-build) do_build=0; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

# libopenblas-openmp-dev: OpenBLAS's OpenMP build, so GEMMs and tpr's kernels
# share one libgomp thread pool (CMakeLists.txt links it by path, whichever
# build the libopenblas.so.0 alternative points at).
packages=(build-essential cmake pkg-config git
          openmpi-bin libopenmpi-dev libopenblas-openmp-dev libuv1-dev
          libprotobuf-c-dev protobuf-c-compiler libcjson-dev libcmocka-dev libxxhash-dev
          libpcre2-dev libutf8proc-dev libhttp-parser-dev curl gnuplot-nox python3)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

[ "$do_build" = 1 ] || exit 0
export PATH="$PATH:/usr/local/cuda/bin"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="$build_type" -DTPR_CUDA="${TPR_CUDA:-AUTO}" \
      -DTPR_SANITIZE="$sanitize" > "$build_dir.configure.log" 2>&1 \
  || { cat "$build_dir.configure.log"; exit 1; }
grep -E "^-- tpr:" "$build_dir.configure.log" || true
cmake --build "$build_dir" -j "$(nproc)"
echo "setup: built $build_dir/bin/tpr ($build_type, sanitize=$sanitize)"
