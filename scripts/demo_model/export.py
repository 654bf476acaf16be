#!/usr/bin/env python3
"""The embedded demo model from a `tpr train --save` checkpoint: every weight
cast to bf16 (round to nearest even, as torch does), except the routers'
e_score_correction_bias, kept f32: it is added to sigmoid scores in (0, 1)
to pick the top-2 experts, and bf16's 8 bits of mantissa would move ties.
Copies the config (torch_dtype bfloat16) and the tokenizer files beside it.

Usage: export.py --ckpt build/demo_run/ckpt --tokenizer build/demo_data/tokenizer --out tests/fixtures/demo_model
"""
import argparse
import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--f32", action="store_true", help="keep f32 weights (to measure what bf16 costs)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    sd = load_file(os.path.join(a.ckpt, "model.safetensors"))
    out = {k: (v if a.f32 or k.endswith("e_score_correction_bias") else v.to(torch.bfloat16)).contiguous()
           for k, v in sorted(sd.items())}
    save_file(out, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(a.ckpt, "config.json")))
    cfg["torch_dtype"] = "float32" if a.f32 else "bfloat16"
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.tokenizer, name), os.path.join(a.out, name))
    n = sum(v.numel() for v in out.values())
    print(f"export: {len(out)} tensors, {n} parameters, {os.path.getsize(os.path.join(a.out, 'model.safetensors'))} "
          f"bytes -> {a.out}")


if __name__ == "__main__":
    main()
