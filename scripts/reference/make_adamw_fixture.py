#!/usr/bin/env python3
"""Writes tests/fixtures/adamw/adamw_torch.json: five steps of
torch.optim.AdamW (foreach=False, fused=False: the single-tensor path) on
three small random tensors, so test_train_host can replay them through
train/adamw.c and compare bit for bit.

    scripts/reference/.venv/bin/python scripts/reference/make_adamw_fixture.py \
        [--out tests/fixtures/adamw/adamw_torch.json]

Two parameter groups as nanoGPT builds them: matrices with weight decay,
a bias-like vector without. The learning rate changes every step (as a
schedule would set group["lr"]). Every value the C side consumes (lr,
weight_decay, inputs) is an f32 value, because tpr_adamw_step takes f32 lr
and weight_decay; betas and eps are the Python doubles 0.9, 0.95, 1e-8 that
tpr's defaults also hold. Grads span several magnitudes, including ones
small enough that eps matters in the denominator.

Floats are stored as their IEEE-754 bit patterns (uint32) so nothing is
lost in JSON; `params[k]`, `exp_avg[k]`, `exp_avg_sq[k]` are the values
after step k+1.

torch's CPU sqrt on f32 is not correctly rounded (with MKL it goes through
MKL's vector math; about 1 in 6 random inputs comes out 1 ulp off), while
C's sqrtf is. `sqrt_off[k]` lists the elements whose torch.sqrt(exp_avg_sq)
at step k+1 differs from the correctly rounded square root, so the C test
can tell those apart from a real difference in the update.
"""
import argparse
import json
import os
import struct

import torch

SEED = 1234
BETAS = (0.9, 0.95)
EPS = 1e-8
LRS = [1e-3, 3e-3, 2e-3, 5e-4, 1e-2]
WD = 0.1
TENSORS = [("w2d", (5, 13), True), ("w3d", (2, 3, 7), True), ("bias", (37,), False)]


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bits(t):
    return [struct.unpack("<I", struct.pack("<f", float(x)))[0] for x in t.reshape(-1).tolist()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures",
                                                  "adamw", "adamw_torch.json"))
    args = ap.parse_args()
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    lrs = [f32(x) for x in LRS]
    wd = f32(WD)
    params, grads = [], []
    for _, shape, _ in TENSORS:
        params.append(torch.nn.Parameter(torch.randn(shape, dtype=torch.float32)))
        steps = []
        for _ in lrs:
            g = torch.randn(shape, dtype=torch.float32)
            # magnitudes from 1e-6 to 10 per element, so eps and large steps both occur
            g = g * torch.pow(10.0, torch.randint(-6, 2, shape).to(torch.float32))
            steps.append(g)
        grads.append(steps)
    init = [p.detach().clone() for p in params]

    decay = [p for p, (_, _, d) in zip(params, TENSORS) if d]
    no_decay = [p for p, (_, _, d) in zip(params, TENSORS) if not d]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lrs[0], betas=BETAS, eps=EPS, foreach=False, fused=False)
    after = [[] for _ in params]
    for k, lr in enumerate(lrs):
        for g in opt.param_groups:
            g["lr"] = lr
        for p, gs in zip(params, grads):
            p.grad = gs[k].clone()
        opt.step()
        for i, p in enumerate(params):
            st = opt.state[p]
            assert float(st["step"]) == k + 1
            v = st["exp_avg_sq"]
            off = (v.sqrt() != v.double().sqrt().float()).reshape(-1).nonzero().reshape(-1).tolist()
            after[i].append((p.detach().clone(), st["exp_avg"].clone(), v.clone(), off))

    out = {
        "generator": "scripts/reference/make_adamw_fixture.py",
        "torch_version": torch.__version__,
        "seed": SEED,
        "betas": list(BETAS),
        "eps": EPS,
        "lr": lrs,
        "tensors": [],
    }
    for i, (name, shape, d) in enumerate(TENSORS):
        out["tensors"].append({
            "name": name,
            "shape": list(shape),
            "weight_decay": wd if d else 0.0,
            "init": bits(init[i]),
            "grads": [bits(g) for g in grads[i]],
            "params": [bits(a[0]) for a in after[i]],
            "exp_avg": [bits(a[1]) for a in after[i]],
            "exp_avg_sq": [bits(a[2]) for a in after[i]],
            "sqrt_off": [a[3] for a in after[i]],
        })
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
