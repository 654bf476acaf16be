#!/usr/bin/env bash
# Makes (once) a small venv with the official openai client, pinned as in
# scripts/reference/requirements.txt, for test_serve.sh's client check, and
# prints its python. Exits 1 (printing nothing) when PyPI cannot be reached.
#
#   scripts/serve/openai_venv.sh [DIR]   (default: build/openai-venv)
set -u
cd "$(dirname "$0")/../.."
dir=${1:-build/openai-venv}
pin=$(grep -E '^openai==' scripts/reference/requirements.txt)
if [ ! -x "$dir/bin/python" ] || ! "$dir/bin/python" -c "import openai" 2>/dev/null; then
  python3 -m venv "$dir" >/dev/null 2>&1 || exit 1
  "$dir/bin/python" -m pip install --disable-pip-version-check -q "$pin" >/dev/null 2>&1 || exit 1
fi
echo "$(pwd)/$dir/bin/python"
