#!/usr/bin/env bash
# Data of the embedded demo model (tests/fixtures/demo_model): installs
# Debian's `fortunes` (BSD fortune(6) quote files, BSD licence) if missing,
# then scripts/demo_model/prepare_data.py cleans the quotes, holds out 5% of
# them, trains the byte-level BPE tokenizer and writes the token files.
# Usage: scripts/demo_model/prepare_data.sh [OUT=build/demo_data]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-build/demo_data}
SRC=/usr/share/games/fortunes
if [ ! -f "$SRC/cookie" ]; then
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq fortunes >/dev/null
fi
PY=${PYTHON:-scripts/reference/.venv/bin/python}
[ -x "$PY" ] || { scripts/reference/setup_venv.sh >/dev/null; }
"$PY" scripts/demo_model/prepare_data.py --src "$SRC" --out "$OUT"
