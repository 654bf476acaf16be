#!/usr/bin/env bash
# The main job on the embedded default model: installs and builds, then runs
# the tensor-parallel MLP block program on 2 ranks under mpirun (and on 1
# rank without it), each checked against the unsharded block.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo
echo "== mpirun -np 2 tpr mlp --config configs/tiny_mlp.json"
mpirun -np 2 --oversubscribe build/bin/tpr mlp --config configs/tiny_mlp.json
echo
echo "== tpr mlp (no mpirun: a world of one) --json"
build/bin/tpr mlp --config configs/tiny_mlp.json --json
echo
echo "== tpr program --tp 2 --summary (the program every rank runs)"
build/bin/tpr program --config configs/tiny_mlp.json --tp 2 --summary
