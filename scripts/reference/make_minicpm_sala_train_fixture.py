#!/usr/bin/env python3
"""Writes the MiniCPM-SALA training golden fixture (tests/fixtures/minicpm_sala_train):
AdamW steps of the float64 plain-PyTorch reference (minicpm_sala_ref.py),
started from the committed tiny checkpoint (tests/fixtures/minicpm_sala_tiny:
sparse layers 0 and 3, lightning layers 1 and 2, every published option on).

    scripts/reference/.venv/bin/python scripts/reference/make_minicpm_sala_train_fixture.py

The recipe is train_fixture.py's (tpr's train loop) with the cross-entropy
alone (a dense model: no router, no aux loss): per window of --seq-len tokens
(64 by default, past the checkpoint's sparse_config.dense_len 48, so every
token of a window is sparse and a query of block 7 has 5 candidate blocks for
topk - init_blocks = 2 slots) loss = cross_entropy(forward(window)), the mean
over the step's windows, clip_grad_norm_, torch.optim.AdamW. Each window is
one call of the reference from an empty cache (position 0), as tpr train runs
one whole sequence per window.

Gradients are torch autograd's through the reference as written: the block
selection (minicpm_sala_ref.select_blocks) reads its scores as Python floats
and returns block indices, so it carries no gradient, and the compressed keys
feed only that selection, so their path to k_proj carries none either (the
published forward computes them for the stage-1 top-k kernel alone, whose
output is a block index set; docs/minicpm-sala.md "Training"); the attention
over the selected keys is differentiable in q, k and v. The script checks
that the selection matters: the step-0 gradients with the sparse layers forced
dense must differ (else the fixture would not test the selection).

Outputs (the checkpoint's tensor names): tokens.npy, step0_grads.safetensors,
final_params.safetensors (f32), meta.json (the keys tests/train_harness.c reads).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import minicpm_sala_ref as ref  # noqa: E402
from train_fixture import (adamw, add_train_args, finish, optimizer_meta, optimizer_step, save_tensors,  # noqa: E402
                           write_meta, zipf_tokens)
from family_fixture import REPO  # noqa: E402

GEN = "scripts/reference/make_minicpm_sala_train_fixture.py"


def load(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        d = json.load(f)
    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        W = {n: f.get_tensor(n).to(torch.float64).requires_grad_(True) for n in f.keys()}
    return ref.Config(d), W


def window_loss(cfg, W, x, force_dense=False):
    """x: a window's T + 1 tokens; the cross-entropy of the T next tokens."""
    logits = ref.forward(cfg, W, x[:-1].tolist(), ref.Cache(cfg), force_dense=force_dense)  # (T, V)
    return torch.nn.functional.cross_entropy(logits, x[1:])


def step0_grads(cfg, W, tokens, T, nw, force_dense):
    for p in W.values():
        p.grad = None
    total = 0.0
    for w in range(nw):
        loss = window_loss(cfg, W, tokens[w * T: w * T + T + 1], force_dense) / nw
        loss.backward()
        total += loss.item()
    g = {n: p.grad.detach().clone() for n, p in W.items()}
    for p in W.values():
        p.grad = None
    return total, g


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_train_args(ap, "minicpm_sala_train", "minicpm_sala_tiny", seed=3535, steps=4, aux_coef=0.0, warmup=2)
    ap.set_defaults(seq_len=64, clip=0.7)  # 0.7: clipping active on some steps
    args = ap.parse_args()
    if args.aux_coef != 0.0:
        finish(["--aux-coef: minicpm_sala has no experts, its loss is the cross-entropy alone"])
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cfg, W = load(args.model)
    T, nw = args.seq_len, args.windows_per_step
    if T < cfg.sparse.dense_len:
        finish([f"--seq-len {T} is below dense_len {cfg.sparse.dense_len}: the sparse layers would run dense"])
    V = cfg.d["vocab_size"]
    tokens, _ = zipf_tokens(V, args.steps * nw * T + 1, args)

    # The selection must matter: step 0 with the sparse layers forced dense.
    _, dense_g = step0_grads(cfg, W, tokens, T, nw, True)

    params = list(W.items())
    opt, trained = adamw(params, args)
    rec = {"loss": [], "ce": [], "aux": [], "grad_norm": [], "lr": []}
    grads0 = None
    for s in range(args.steps):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for j in range(nw):
            w = s * nw + j
            loss = window_loss(cfg, W, tokens[w * T: w * T + T + 1])
            (loss / nw).backward()
            total += loss.item()
        if s == 0:
            grads0 = {n: p.grad.detach().clone() for n, p in params}
        gn, lr = optimizer_step(opt, trained, s, args)
        for key, v in (("loss", total / nw), ("ce", total / nw), ("aux", 0.0), ("grad_norm", gn), ("lr", lr)):
            rec[key].append(v)
        print(f"step {s}: loss {total / nw:.6f} grad_norm {gn:.4f} lr {lr:.4g}")

    problems = []
    sparse_vs_dense = {}
    for n in grads0:
        if ".self_attn." in n and any(n.startswith(f"model.layers.{i}.") for i, m in enumerate(cfg.mixers)
                                      if m == ref.SPARSE):
            d = (grads0[n] - dense_g[n]).abs().max().item() / grads0[n].abs().max().item()
            sparse_vs_dense[n] = d
    worst_dense = max(sparse_vs_dense.values())
    print(f"sparse vs all-dense step-0 gradients of the sparse layers: max rel diff {worst_dense:.3g}")
    if worst_dense < 1e-2:
        problems.append(f"the step-0 gradients differ from the all-dense ones by only {worst_dense:.2e}")
    if any(not bool((g != 0).any()) for g in grads0.values()):
        problems.append("a parameter got no step-0 gradient")
    if not any(g > args.clip for g in rec["grad_norm"]):
        problems.append("clipping never active")

    os.makedirs(args.out, exist_ok=True)
    np.save(os.path.join(args.out, "tokens.npy"), tokens.numpy().astype("<i4"))
    f32 = lambda t: {n: v.detach().float().contiguous() for n, v in t.items()}  # noqa: E731
    save_tensors(args.out, {"step0_grads.safetensors": f32(grads0), "final_params.safetensors": f32(W)},
                 f"{GEN}, torch {torch.__version__}")
    meta = {
        "generator": GEN,
        "versions": {"torch": torch.__version__},
        "model": {"class": "scripts/reference/minicpm_sala_ref.py (float64)",
                  "checkpoint": "tests/fixtures/minicpm_sala_tiny", "mixer_types": cfg.mixers,
                  "sparse_config": cfg.d["sparse_config"], "router_aux_loss_coef": 0.0, "moe_layers_routed": 0},
        "data": {"file": "tokens.npy", "seed": args.seed, "seq_len": T, "windows_per_step": nw,
                 "window": "window w = tokens[w*T : w*T+T+1]; inputs = first T, targets = last T"},
        "loss": {"per_window": "cross_entropy(logits, targets) (no aux loss: no experts)",
                 "selection": "block indices under no gradient; compressed keys feed only the selection"},
        "optimizer": optimizer_meta(args, "torch.optim.AdamW (float64 params)"),
        "records": rec,
        "checks": {"sparse_vs_all_dense_step0_grad_max_rel_diff": worst_dense},
        "problems": problems,
    }
    write_meta(args.out, meta, problems)


if __name__ == "__main__":
    main()
