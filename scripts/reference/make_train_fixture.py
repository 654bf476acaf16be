#!/usr/bin/env python3
"""Writes the MiniMax-M2 training golden fixture (tests/fixtures/minimax_m2_train):
10 AdamW steps of transformers' own MiniMaxM2ForCausalLM, started from the
committed tiny checkpoint (tests/fixtures/minimax_m2_tiny), in f32 on CPU.

    bash scripts/reference/setup_venv.sh
    scripts/reference/.venv/bin/python scripts/reference/make_train_fixture.py \
        --out tests/fixtures/minimax_m2_train

The training recipe (what tpr's train loop implements):
  data     tokens.npy, int32 [n_windows*T + 1] drawn with a seeded torch.Generator
           in [0, vocab) from a Zipf unigram (not uniform, so that the loss can
           fall in 10 steps; the exact draw is in meta.json). Window w = tokens[w*T : w*T+T+1]: inputs its first T,
           targets its last T. Step s uses windows 2s and 2s+1.
  loss     per window: out = model(input_ids=inputs[None], output_router_logits=True)
           loss_w = cross_entropy(out.logits[0], targets) (mean over T)
                    + coef * out.aux_loss        (coef = router_aux_loss_coef, set to 0.02)
           step loss = mean of the two windows' loss_w (each backward on loss_w / 2,
           gradients accumulate).
  aux      transformers' load_balancing_loss_func over this window's router logits of
           all layers (formula in meta.json "aux_loss_formula").
  clip     clip_grad_norm_(trained params, clip) after both backwards.
  optim    torch.optim.AdamW(foreach=False), betas (0.9, 0.95), eps 1e-8, weight decay
           0.1 for params with ndim >= 2 (in transformers' in-memory layout, where the
           experts are fused 3-D tensors), 0 for the rest; lr set on every group before
           each step: linear warmup lr_max*(s+1)/warmup for s < warmup, then cosine
           from lr_max to min_lr over the remaining total-warmup steps.

Outputs (tensors under the checkpoint names of tests/fixtures/minimax_m2_tiny/
model.safetensors, i.e. what save_pretrained writes and tpr loads:
model.layers.L.block_sparse_moe.experts.E.{w1,w2,w3}.weight, ...):
  tokens.npy                 '<i4' [n_windows*T + 1]
  step0_grads.safetensors    gradient of every trained parameter at step 0: the
                             accumulated 2-window gradient BEFORE clipping (f32)
  params_step5.safetensors   every parameter (and the e_score_correction_bias
                             buffers) after 5 optimizer steps
  final_params.safetensors   the same after all steps; loadable as model.safetensors
  meta.json                  hyperparameters, per-step losses / grad norms / lr,
                             trained parameter names, versions, the aux formula.
"""
import argparse
import json
import os
import sys

import numpy as np
import safetensors
import torch
import torch.nn.functional as F
import transformers
from transformers import MiniMaxM2ForCausalLM
from transformers.models.minimax_m2 import modeling_minimax_m2 as mm2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_fixture import (REPO, add_train_args, adamw, aux_independent, check_hub_mapping, fail,  # noqa: E402
                           finish, load_for_training, optimizer_step, save_tensors, zipf_tokens)

transformers.utils.logging.disable_progress_bar()

GEN = "scripts/reference/make_train_fixture.py"

AUX_FORMULA = (
    "transformers.models.minimax_m2.modeling_minimax_m2.load_balancing_loss_func(router_logits of all L layers, "
    "E=num_local_experts, top_k=num_experts_per_tok, attention_mask=None) (Switch-Transformer loss): "
    "for every layer l and token t, p[l,t,:] = softmax(router_logits[l,t,:]) over the E experts "
    "(SOFTMAX of the raw gate logits, not the sigmoid the router routes with), and sel[l,t] = the top_k "
    "experts of p[l,t,:] (torch.topk of the softmax, NO e_score_correction_bias, so not necessarily the "
    "experts the token was routed to). Over the N = L*T rows of all layers pooled together: "
    "f[e] = (number of (l,t,j) with sel[l,t,j] == e) / N (sums to top_k; a count, no gradient), "
    "P[e] = sum_{l,t} p[l,t,e] / N; aux = E * sum_e f[e] * P[e]. "
    "Gradient flows only through P (i.e. through softmax(router_logits)) into the gate weights and upstream.")


def to_hub(tensors, config):
    """transformers' in-memory names -> checkpoint (hub) names: the fused experts
    gate_up_proj (E, 2I, H) = cat(w1, w3) along the output dim, down_proj (E, H, I)
    = w2; mlp.* -> block_sparse_moe.*. Checked against save_pretrained in main()."""
    I = config.intermediate_size
    out = {}
    for n, t in tensors.items():
        t = t.detach().float().contiguous()
        if ".mlp.experts.gate_up_proj" in n:
            pre = n.replace(".mlp.experts.gate_up_proj", ".block_sparse_moe.experts.")
            assert t.shape[1] == 2 * I, (n, t.shape)
            for e in range(t.shape[0]):
                out[f"{pre}{e}.w1.weight"] = t[e, :I].contiguous()
                out[f"{pre}{e}.w3.weight"] = t[e, I:].contiguous()
        elif ".mlp.experts.down_proj" in n:
            pre = n.replace(".mlp.experts.down_proj", ".block_sparse_moe.experts.")
            for e in range(t.shape[0]):
                out[f"{pre}{e}.w2.weight"] = t[e].contiguous()
        elif ".mlp." in n:
            out[n.replace(".mlp.", ".block_sparse_moe.")] = t
        else:
            out[n] = t
    return out


def checkpoint_tensors(model, names_only=None):
    """Parameters + e_score_correction_bias buffers under hub names."""
    sd = {n: p for n, p in model.named_parameters()}
    for n, b in model.named_buffers():
        if n.endswith("e_score_correction_bias"):
            sd[n] = b
    return to_hub(sd, model.config)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_train_args(ap, "minimax_m2_train", "minimax_m2_tiny", seed=4321, steps=10, aux_coef=0.02, warmup=3)
    ap.add_argument("--snapshot-step", type=int, default=5, help="write params_step<N> after N steps")
    args = ap.parse_args()

    # ---- model: transformers' own class, f32, training mode
    model, coef_in_checkpoint = load_for_training(MiniMaxM2ForCausalLM, args)
    config = model.config
    if config.attention_dropout != 0.0 or config.router_jitter_noise != 0.0:
        fail(f"training mode is not deterministic: attention_dropout {config.attention_dropout}, "
             f"router_jitter_noise {config.router_jitter_noise}")
    E, k, V, L = config.num_local_experts, config.num_experts_per_tok, config.vocab_size, config.num_hidden_layers

    # the hub-name mapping is transformers' own (save_pretrained) layout, bit for bit
    check_hub_mapping(model, checkpoint_tensors(model), args.model)

    # ---- what is trained: e_score_correction_bias is an nn.Buffer in this version
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    buffers = [n for n, _ in model.named_buffers()]
    bias_is_param = any(n.endswith("e_score_correction_bias") for n, _ in model.named_parameters())
    bias_is_buffer = any(n.endswith("e_score_correction_bias") for n in buffers)
    if bias_is_param or not bias_is_buffer:
        fail("expected e_score_correction_bias to be a buffer (not a parameter) in transformers "
             f"{transformers.__version__}; update the fixture's notes")
    decay_names = [n for n, p in params if p.ndim >= 2]
    no_decay_names = [n for n, p in params if p.ndim < 2]
    opt, trained = adamw(params, args)

    # ---- data
    T, W = args.seq_len, args.windows_per_step
    n_windows = args.steps * W
    # Zipf(s) unigram over a seeded permutation of the vocabulary: uniform tokens
    # (the best loss is ln V, ~0.25 below the start) leave nothing to learn in 10
    # steps of fresh windows, and the loss would not decrease beyond window noise.
    tokens, probs = zipf_tokens(V, n_windows * T + 1, args)
    unigram_entropy = float(-(probs * probs.log()).sum())
    assert int(tokens.min()) >= 0 and int(tokens.max()) < V
    tokens_np = tokens.numpy().astype("<i4")
    assert tokens_np.dtype.str == "<i4" and tokens_np.shape == (n_windows * T + 1,)

    def window(w):
        x = tokens[w * T: w * T + T + 1]
        return x[:T], x[1:]

    bias_before = {n: b.clone() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")}

    rec = {"loss": [], "ce": [], "aux": [], "grad_norm": [], "lr": [], "clipped": []}
    window_losses_step0 = []
    aux_checks = []
    hf_loss_checks = []
    step0_grads = None
    params_step5 = None
    bias_got_grad = None
    for s in range(args.steps):
        opt.zero_grad(set_to_none=True)
        loss_sum = ce_sum = aux_sum = 0.0
        for j in range(W):
            w = s * W + j
            inputs, targets = window(w)
            out = model(input_ids=inputs[None], output_router_logits=True, use_cache=False)
            ce = F.cross_entropy(out.logits[0], targets, ignore_index=-100)
            aux = out.aux_loss
            if not torch.is_tensor(aux):
                fail(f"out.aux_loss is {aux!r}, not a tensor")
            if len(out.router_logits) != L or tuple(out.router_logits[0].shape) != (T, E):
                fail(f"router_logits: {len(out.router_logits)} x {tuple(out.router_logits[0].shape)}")
            loss_w = ce + args.aux_coef * aux
            (loss_w / W).backward()
            loss_sum += loss_w.item()
            ce_sum += ce.item()
            aux_sum += aux.item()
            aux_checks.append(abs(aux_independent([r.detach() for r in out.router_logits], E, k) - aux.item()))
            if s == 0:
                window_losses_step0.append({"window": w, "loss": loss_w.item(), "ce": ce.item(), "aux": aux.item()})
                # transformers' own loss (labels given as shift_labels) agrees with this definition
                with torch.no_grad():
                    hf = model(input_ids=inputs[None], labels=targets[None], shift_labels=targets[None],
                               output_router_logits=True, use_cache=False).loss
                hf_loss_checks.append(abs(hf.item() - loss_w.item()))
        if s == 0:
            step0_grads = {n: p.grad.detach().clone() for n, p in params}
            bias_got_grad = any(b.grad is not None for n, b in model.named_buffers()
                                if n.endswith("e_score_correction_bias"))
        gn, lr = optimizer_step(opt, trained, s, args)
        rec["loss"].append(loss_sum / W)
        rec["ce"].append(ce_sum / W)
        rec["aux"].append(aux_sum / W)
        rec["grad_norm"].append(gn)
        rec["lr"].append(lr)
        rec["clipped"].append(gn > args.clip)
        print(f"step {s}: loss {loss_sum / W:.6f} ce {ce_sum / W:.6f} aux {aux_sum / W:.6f} "
              f"grad_norm {gn:.6f}{' (clipped)' if gn > args.clip else ''} lr {lr:.6g}")
        if s + 1 == args.snapshot_step:
            params_step5 = checkpoint_tensors(model)
    final = checkpoint_tensors(model)

    # ---- checks
    problems = []
    if not (rec["loss"][-1] < rec["loss"][0] and sum(rec["loss"][-3:]) < sum(rec["loss"][:3])):
        problems.append(f"loss did not decrease: {rec['loss']}")
    if not any(rec["clipped"]):
        problems.append(f"clipping at {args.clip} was never active (grad norms {rec['grad_norm']}); lower --clip")
    if max(aux_checks) > 1e-5:
        problems.append(f"out.aux_loss differs from the re-derived Switch loss by {max(aux_checks)}")
    if max(hf_loss_checks) > 1e-5:
        problems.append(f"transformers' own loss (labels + aux) differs from ce + coef*aux by {max(hf_loss_checks)}")
    if bias_got_grad:
        problems.append("e_score_correction_bias received a gradient")
    for n, b in model.named_buffers():
        if n.endswith("e_score_correction_bias") and not torch.equal(b, bias_before[n]):
            problems.append(f"{n} changed during training")
    # every trained tensor gets a nonzero step-0 gradient, except expert slices of
    # experts no token of the two windows was routed to (a structural zero)
    grads_hub = to_hub(step0_grads, config)
    zero_grads = sorted(n for n, g in grads_hub.items() if not bool((g != 0).any()))
    if any(not torch.isfinite(g).all() for g in grads_hub.values()):
        problems.append("non-finite step-0 gradient")
    routed = {}  # layer -> set of experts that some token of windows 0/1 was routed to
    with torch.no_grad():
        tmp = MiniMaxM2ForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager",
                                                   experts_implementation="eager").eval()
        for w in range(W):
            inputs, _ = window(w)
            o = tmp(input_ids=inputs[None], output_router_logits=True, use_cache=False)
            for li, rl in enumerate(o.router_logits):
                bias = tmp.model.layers[li].mlp.e_score_correction_bias
                idx = torch.topk(torch.sigmoid(rl.float()) + bias, k, dim=-1).indices
                routed.setdefault(li, set()).update(int(i) for i in idx.reshape(-1))
    expected_zero = sorted(f"model.layers.{li}.block_sparse_moe.experts.{e}.{m}.weight"
                           for li in range(L) for e in range(E) if e not in routed[li] for m in ("w1", "w2", "w3"))
    if zero_grads != expected_zero:
        problems.append(f"zero step-0 gradients {zero_grads} != unrouted expert weights {expected_zero}")

    # ---- write
    os.makedirs(args.out, exist_ok=True)
    np.save(os.path.join(args.out, "tokens.npy"), tokens_np)
    save_tensors(args.out, {"step0_grads.safetensors": grads_hub, "params_step5.safetensors": params_step5,
                            "final_params.safetensors": final}, f"{GEN}, transformers {transformers.__version__}")

    hub_trained = sorted(grads_hub)
    meta = {
        "generator": GEN,
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "safetensors": safetensors.__version__, "numpy": np.__version__,
                     "python": sys.version.split()[0]},
        "model": {"class": "transformers.MiniMaxM2ForCausalLM",
                  "checkpoint": os.path.relpath(os.path.abspath(args.model), REPO),
                  "dtype": "float32", "attn_implementation": "eager", "experts_implementation": "eager",
                  "mode": "model.train() (attention_dropout 0, router_jitter_noise 0: deterministic)",
                  "router_aux_loss_coef_in_checkpoint": coef_in_checkpoint,
                  "router_aux_loss_coef": args.aux_coef},
        "data": {"file": "tokens.npy", "dtype": "<i4", "length": int(tokens_np.shape[0]),
                 "draw": f"g = torch.Generator().manual_seed({args.seed}); perm = torch.randperm({V}, generator=g); "
                         f"probs[perm[r]] = (r+1)^-{args.zipf} / sum (float64, r = 0..{V - 1}); "
                         f"torch.multinomial(probs, {tokens_np.shape[0]}, replacement=True, generator=g); "
                         "saved as int32",
                 "why_not_uniform": "with uniform tokens the best possible CE is ln V, about 0.25 below the "
                                    "initial CE, and 10 steps on fresh windows do not decrease the loss beyond "
                                    "window-to-window noise; a Zipf unigram gives the model something to learn",
                 "unigram_entropy_nats": unigram_entropy,
                 "seed": args.seed, "seq_len": T, "windows_per_step": W, "n_windows": n_windows,
                 "window": "window w = tokens[w*T : w*T+T+1]; inputs = first T, targets = last T",
                 "step_windows": "step s uses windows W*s .. W*s+W-1"},
        "loss": {
            "per_window": "F.cross_entropy(logits[0] (T, V), targets, ignore_index=-100) (mean over T) "
                          "+ router_aux_loss_coef * out.aux_loss",
            "per_step": "mean of the W windows' losses; each window's backward is on loss_w / W, "
                        "gradients accumulate",
            "aux_loss_formula": AUX_FORMULA,
            "aux_function": "transformers.models.minimax_m2.modeling_minimax_m2.load_balancing_loss_func",
        },
        "optimizer": {
            "class": "torch.optim.AdamW", "foreach": False, "betas": [0.9, 0.95], "eps": 1e-8,
            "weight_decay": {"ndim>=2": args.weight_decay, "ndim<2": 0.0},
            "update": "decoupled: p *= 1 - lr*wd; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; "
                      "p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps), t = step+1",
            "decay_group_inmemory": decay_names, "no_decay_group_inmemory": no_decay_names,
            "decay_note": "ndim is taken in transformers' in-memory layout; every hub tensor from a decayed "
                          "in-memory tensor (all expert w1/w2/w3) is 2-D, so the rule 'decay iff ndim >= 2' "
                          "gives the same groups on hub names",
            "lr_schedule": {"lr_max": args.lr_max, "warmup": args.warmup, "min_lr": args.min_lr,
                            "total": args.steps,
                            "formula": "s < warmup: lr_max*(s+1)/warmup; else progress=(s-warmup)/max(1,total-warmup),"
                                       " lr = min_lr + 0.5*(lr_max-min_lr)*(1+cos(pi*progress)); "
                                       "set on every group before optimizer.step()"},
            "grad_clip": {"max_norm": args.clip,
                          "how": "torch.nn.utils.clip_grad_norm_(trained params, max_norm) after the W backwards, "
                                 "before step: total L2 norm over all grads; if > max_norm, grads *= "
                                 "max_norm/(norm + 1e-6)"},
            "steps": args.steps,
        },
        "trained_parameters": {
            "hub_names": hub_trained,
            "inmemory_names": [n for n, _ in params],
            "not_trained": "model.layers.L.block_sparse_moe.e_score_correction_bias: an nn.Buffer (not a "
                           "parameter) in this transformers version; it is used only through topk (no "
                           "gradient path) and receives no gradient; it is unchanged in params_step5/final_params",
            "hub_layout": "in-memory experts.gate_up_proj (E, 2I, H) = cat(w1, w3) on dim 1; experts.down_proj "
                          "(E, H, I) = w2; mlp.gate.weight = block_sparse_moe.gate.weight",
        },
        "step0_zero_gradients": {"names": zero_grads,
                                 "why": "expert weights of experts no token of windows 0..W-1 was routed to "
                                        "(structural zero); every other trained tensor has a nonzero gradient"},
        "records": {
            "loss": rec["loss"], "ce": rec["ce"], "aux": rec["aux"],
            "grad_norm_before_clip": rec["grad_norm"], "clipped": rec["clipped"], "lr": rec["lr"],
            "step0_windows": window_losses_step0,
            "note": "loss/ce/aux are the step means over its W windows, computed before that step's update",
        },
        "files": {
            "step0_grads.safetensors": "gradient of every trained parameter at step 0 (accumulated over the W "
                                       "windows, before clipping), hub names, f32",
            "params_step5.safetensors": f"every parameter + e_score_correction_bias after {args.snapshot_step} steps",
            "final_params.safetensors": f"every parameter + e_score_correction_bias after {args.steps} steps "
                                        "(a loadable model.safetensors)",
        },
        "checks": {
            "aux_loss_vs_rederived_float64_max_abs_diff": max(aux_checks),
            "hf_own_loss_vs_ce_plus_coef_aux_max_abs_diff": max(hf_loss_checks),
            "hub_mapping_equals_save_pretrained": True,
            "e_score_correction_bias": {"is_parameter": bias_is_param, "is_buffer": bias_is_buffer,
                                        "got_grad": bool(bias_got_grad)},
            "routed_experts_windows_0_1": {str(li): sorted(v) for li, v in routed.items()},
        },
        "problems": problems,
    }
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")

    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print(f"aux loss: {AUX_FORMULA}")
    print(f"e_score_correction_bias: parameter={bias_is_param} buffer={bias_is_buffer} grad={bool(bias_got_grad)}")
    print(f"step-0 window losses: {[round(x['loss'], 6) for x in window_losses_step0]}; "
          f"zero step-0 grads: {zero_grads or 'none'}")
    print(f"aux re-derived max diff {max(aux_checks):.2e}; HF own loss vs definition {max(hf_loss_checks):.2e}")
    total = 0
    print(f"wrote {args.out}:")
    for fn in ("tokens.npy", "step0_grads.safetensors", "params_step5.safetensors", "final_params.safetensors",
               "meta.json"):
        sz = os.path.getsize(os.path.join(args.out, fn))
        total += sz
        print(f"  {fn:26s} {sz:>8d} bytes")
    print(f"  total {total} bytes")
    finish(problems)


if __name__ == "__main__":
    main()
