#!/usr/bin/env python3
"""Writes tests/fixtures/sala_lightning/: the lightning-attention core of
MiniCPM-SALA's linear layers as minicpm_sala_ref.py defines it
(docs/minicpm-sala.md: simple gated linear attention, ALiBi slopes with no
per-layer factor, scale 1/sqrt(D)), in float64 on float32 inputs, for
test_sala_lightning (tpr's lightning ops with those slopes and q scaled).

    scripts/reference/.venv/bin/python scripts/reference/make_sala_lightning_fixture.py \
        [--out-dir tests/fixtures/sala_lightning]

H 6 heads (not a power of two: the slope rule's second branch) of D 8. A
19-token prefill from the zero state (q, k, v, out, state), then 3 tokens
from that state (q2, k2, v2, out2, state2); slopes for H = 6 and for 4 and 32
heads (slopes6, slopes4, slopes32). float32 little-endian .npy; meta.json.
"""
import argparse
import json
import math
import os

import numpy as np
import torch

import minicpm_sala_ref as ref

H, D, T, T2 = 6, 8, 19, 3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures",
                                                      "sala_lightning"))
    ap.add_argument("--seed", type=int, default=351)
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(args.seed)
    f32 = lambda *shape: torch.randn(*shape, generator=gen).float().double()
    slopes = torch.tensor(ref.alibi_slopes(H), dtype=torch.float64)
    q, k, v = f32(T, H, D), f32(T, H, D), f32(T, H, D)
    out, state = ref.lightning_core(q, k, v, slopes, 1 / math.sqrt(D), torch.zeros(H, D, D, dtype=torch.float64))
    q2, k2, v2 = f32(T2, H, D), f32(T2, H, D), f32(T2, H, D)
    out2, state2 = ref.lightning_core(q2, k2, v2, slopes, 1 / math.sqrt(D), state)
    arrays = dict(q=q, k=k, v=v, out=out, state=state, q2=q2, k2=k2, v2=v2, out2=out2, state2=state2,
                  slopes6=slopes, slopes4=torch.tensor(ref.alibi_slopes(4)), slopes32=torch.tensor(ref.alibi_slopes(32)))
    os.makedirs(args.out_dir, exist_ok=True)
    for name, a in arrays.items():
        path = os.path.join(args.out_dir, name + ".npy")
        np.save(path, np.ascontiguousarray(a.numpy(), dtype="<f4"))
        os.chmod(path, 0o644)
    with open(os.path.join(args.out_dir, "meta.json"), "w") as f:
        json.dump(dict(heads=H, head_dim=D, T=T, T2=T2, scale=1 / math.sqrt(D), seed=args.seed,
                       torch=torch.__version__), f, indent=1)
        f.write("\n")
    print("wrote", args.out_dir)


if __name__ == "__main__":
    main()
