#!/usr/bin/env python3
"""Writes the Qwen3-MoE training golden fixture (tests/fixtures/qwen3_moe_train):
AdamW steps of transformers' own Qwen3MoeForCausalLM, started from the
committed tiny checkpoint (tests/fixtures/qwen3_moe_tiny: a dense mlp_only
layer, per-head q/k norms, 8 experts top-2 with norm_topk_prob), in f32 on CPU.

    scripts/reference/.venv/bin/python scripts/reference/make_qwen3_train_fixture.py \
        --out tests/fixtures/qwen3_moe_train

The recipe is make_train_fixture.py's (tpr's train loop, train_fixture.py), on this model:
  loss     per window: out = model(input_ids=inputs[None], output_router_logits=True)
           loss_w = cross_entropy(out.logits[0], targets) + coef * out.aux_loss,
           coef = router_aux_loss_coef set to --aux-coef; out.aux_loss is
           modeling_qwen3_moe.load_balancing_loss_func over the router logits of the
           MoE layers only (the dense mlp_only layer has no router), re-derived
           here in float64 as a check.
  step     mean over the windows of a step (backward on loss_w / W each),
           clip_grad_norm_, AdamW(foreach=False, betas (0.9, 0.95), eps 1e-8,
           weight decay on ndim >= 2), warmup + cosine lr.
The router's gradient flows through the renormalised top-k probabilities
(Qwen3MoeTopKRouter: softmax, topk, divided by the chosen sum) and the aux loss.

Outputs (tensors under the checkpoint names of qwen3_moe_tiny/model.safetensors:
model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight, ...): tokens.npy,
step0_grads.safetensors (the accumulated step-0 gradient before clipping),
final_params.safetensors (loadable as model.safetensors), meta.json (the same
keys as minimax_m2_train/meta.json, which tests/test_train_family.c reads).
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import Qwen3MoeForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_fixture import (REPO, adamw, aux_independent, check_hub_mapping, fail, finish,  # noqa: E402
                           fused_experts_to_hub as to_hub, optimizer_step, parse_and_load, save_tensors,
                           zipf_tokens)

GEN = "scripts/reference/make_qwen3_train_fixture.py"


def main():
    args, model, coef_in_checkpoint = parse_and_load(__doc__, Qwen3MoeForCausalLM, "qwen3_moe_train", "qwen3_moe_tiny",
                                                     seed=2718, steps=6, aux_coef=0.05, warmup=2)
    config = model.config
    E, k, V = config.num_experts, config.num_experts_per_tok, config.vocab_size
    moe_layers = [i for i, l in enumerate(model.model.layers) if hasattr(l.mlp, "gate")]

    check_hub_mapping(model, to_hub(dict(model.named_parameters())), args.model)

    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt, trained = adamw(params, args)

    T, W = args.seq_len, args.windows_per_step
    n_windows = args.steps * W
    tokens, _ = zipf_tokens(V, n_windows * T + 1, args)
    tokens_np = tokens.numpy().astype("<i4")

    rec = {"loss": [], "ce": [], "aux": [], "grad_norm": [], "lr": []}
    aux_checks, step0_grads = [], None
    for s in range(args.steps):
        opt.zero_grad(set_to_none=True)
        sums = [0.0, 0.0, 0.0]
        for j in range(W):
            w = s * W + j
            x = tokens[w * T: w * T + T + 1]
            out = model(input_ids=x[:T][None], output_router_logits=True, use_cache=False)
            if len(out.router_logits) != len(moe_layers):
                fail(f"{len(out.router_logits)} router logits for {len(moe_layers)} MoE layers")
            ce = F.cross_entropy(out.logits[0], x[1:], ignore_index=-100)
            loss_w = ce + args.aux_coef * out.aux_loss
            (loss_w / W).backward()
            for i, v in enumerate((loss_w, ce, out.aux_loss)):
                sums[i] += v.item()
            aux_checks.append(abs(aux_independent([r.detach() for r in out.router_logits], E, k) -
                                  out.aux_loss.item()))
        if s == 0:
            step0_grads = {n: p.grad.detach().clone() for n, p in params}
        gn, lr = optimizer_step(opt, trained, s, args)
        for key, v in zip(("loss", "ce", "aux"), sums):
            rec[key].append(v / W)
        rec["grad_norm"].append(gn)
        rec["lr"].append(lr)
        print(f"step {s}: loss {sums[0] / W:.6f} ce {sums[1] / W:.6f} aux {sums[2] / W:.6f} grad_norm {gn:.4f} lr {lr:.4g}")

    problems = []
    if max(aux_checks) > 1e-5:
        problems.append(f"out.aux_loss differs from the re-derived loss by {max(aux_checks)}")
    grads_hub = to_hub(step0_grads)
    gate_grads = [grads_hub[f"model.layers.{l}.mlp.gate.weight"] for l in moe_layers]
    if any(not bool((g != 0).any()) for g in gate_grads):
        problems.append("a router got no step-0 gradient")
    if not any(g > args.clip for g in rec["grad_norm"]):
        problems.append("clipping never active")

    os.makedirs(args.out, exist_ok=True)
    np.save(os.path.join(args.out, "tokens.npy"), tokens_np)
    save_tensors(args.out, {"step0_grads.safetensors": grads_hub,
                            "final_params.safetensors": to_hub(dict(model.named_parameters()))},
                 f"{GEN}, transformers {transformers.__version__}")
    meta = {
        "generator": GEN,
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "model": {"class": "transformers.Qwen3MoeForCausalLM",
                  "checkpoint": os.path.relpath(os.path.abspath(args.model), REPO),
                  "moe_layers": moe_layers, "router_aux_loss_coef_in_checkpoint": coef_in_checkpoint,
                  "router_aux_loss_coef": args.aux_coef},
        "data": {"file": "tokens.npy", "seed": args.seed, "seq_len": T, "windows_per_step": W,
                 "window": "window w = tokens[w*T : w*T+T+1]; inputs = first T, targets = last T"},
        "loss": {"per_window": "cross_entropy(logits, targets) + router_aux_loss_coef * out.aux_loss",
                 "aux_function": "transformers.models.qwen3_moe.modeling_qwen3_moe.load_balancing_loss_func "
                                 "(MoE layers' router logits only)"},
        "optimizer": {"class": "torch.optim.AdamW", "foreach": False, "betas": [0.9, 0.95], "eps": 1e-8,
                      "weight_decay": {"ndim>=2": args.weight_decay, "ndim<2": 0.0},
                      "lr_schedule": {"lr_max": args.lr_max, "warmup": args.warmup, "min_lr": args.min_lr,
                                      "total": args.steps},
                      "grad_clip": {"max_norm": args.clip}, "steps": args.steps},
        "records": rec,
        "checks": {"aux_loss_vs_rederived_float64_max_abs_diff": max(aux_checks)},
        "problems": problems,
    }
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"aux re-derived max diff {max(aux_checks):.2e}; wrote {args.out}")
    finish(problems)


if __name__ == "__main__":
    main()
