#!/usr/bin/env bash
# Creates scripts/reference/.venv and installs requirements.txt from PyPI.
#
#   bash scripts/reference/setup_venv.sh
#
# Idempotent: an existing venv is reused and pip skips what is installed.
# The venv sees the system site-packages, so a system torch==2.15.0 (any
# local build, e.g. 2.15.0+cu132) and safetensors==0.8.0 satisfy the pins
# without a multi-GB download; otherwise pip installs them into the venv.
# PYTHON=/path/to/python3.11+ picks the interpreter (default python3).
# The venv holds a .gitignore of its own ("*"), so git never lists it.
set -euo pipefail
cd "$(dirname "$0")"

py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    { echo "setup_venv.sh: transformers 5.23 needs Python >= 3.11 (set PYTHON=...)" >&2; exit 1; }
  echo "setup_venv: creating scripts/reference/.venv with $("$py" --version)"
  "$py" -m venv --system-site-packages .venv
fi
[ -f .venv/.gitignore ] || printf '*\n' > .venv/.gitignore
.venv/bin/python -m pip install --disable-pip-version-check -q -r requirements.txt
.venv/bin/python - <<'PY'
import safetensors, torch, transformers
from transformers import MiniMaxM2ForCausalLM  # noqa: F401  (the class the M2 fixture needs)
print(f"setup_venv: transformers {transformers.__version__}, torch {torch.__version__}, "
      f"safetensors {safetensors.__version__}")
PY
