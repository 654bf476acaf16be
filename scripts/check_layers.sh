#!/usr/bin/env bash
# Fails on an #include that points up or sideways between tpr's folders
# (the order: scripts/layers.txt). Runs its own controls first.
#   scripts/check_layers.sh [--edges]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 scripts/check_layers.py --self-test > /dev/null || python3 scripts/check_layers.py --self-test
python3 scripts/check_layers.py "$@"
