#!/usr/bin/env python3
"""Checks that transformers loads a checkpoint written by `tpr train --save`
and computes the same logits as tpr.

    scripts/reference/.venv/bin/python scripts/reference/check_trained_checkpoint.py \
        --checkpoint DIR --tpr-logits LOGITS.safetensors --tokens 1,2,3

LOGITS.safetensors is `tpr forward --model DIR --tokens ... --out LOGITS.safetensors`
(key "logits", (T, vocab) f32). Loads DIR with AutoModelForCausalLM.from_pretrained
(the config's class: MiniMaxM2ForCausalLM, Qwen3MoeForCausalLM; float32, eager attention), runs the same tokens, prints the largest difference
relative to the largest logit, and exits 1 when it is above --bound (1e-5).
"""
import argparse
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--tpr-logits", required=True)
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--bound", type=float, default=1e-5)
    a = ap.parse_args()
    ids = torch.tensor([[int(t) for t in a.tokens.split(",")]])
    model = AutoModelForCausalLM.from_pretrained(a.checkpoint, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        want = model(input_ids=ids).logits[0].double()
    got = load_file(a.tpr_logits)["logits"].double()
    if got.shape != want.shape:
        print(f"shape mismatch: tpr {tuple(got.shape)}, transformers {tuple(want.shape)}")
        return 1
    rel = ((got - want).abs().max() / want.abs().max()).item()
    print(f"transformers loaded {a.checkpoint} as {type(model).__name__}; tpr vs transformers logits: max|d|/max|logit| = {rel:.3e} "
          f"(bound {a.bound:.0e}), {ids.shape[1]} tokens")
    return 0 if rel <= a.bound else 1


if __name__ == "__main__":
    sys.exit(main())
