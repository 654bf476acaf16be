#!/usr/bin/env python3
"""Writes a packed-sequence training fixture (tests/fixtures/<family>_pack): step 0
of `tpr train --pack` as PyTorch computes it with transformers' own class, on the
committed tiny checkpoint of MiniMax-M2, Qwen3-MoE, Qwen2-VL (MRoPE; its text decoder)
or MiniMax (lightning attention beside softmax attention), in f32 on CPU.

    scripts/reference/.venv/bin/python scripts/reference/make_pack_train_fixture.py --family qwen3_moe
    scripts/reference/.venv/bin/python scripts/reference/make_pack_train_fixture.py --family minimax_m2
    scripts/reference/.venv/bin/python scripts/reference/make_pack_train_fixture.py --family qwen2_vl
    scripts/reference/.venv/bin/python scripts/reference/make_pack_train_fixture.py --family minimax

MiniMax: transformers' lightning attention layers take no 4-D mask (their state runs
over the whole input), so the packed window is computed as what packing means: each
document run alone through transformers' class (positions from 0, the lightning state
from zero), the documents' logits and router logits joined in window order; the aux loss
over the joined router logits (every token of the window, as tpr computes it). The
controls run the whole window: no_mask with a plain causal mask on the softmax layer
(the lightning layers carry their state across documents) and the restarted positions,
no_mask_no_restart with positions 0..T-1.

The data: W = 2 windows of T = 16 (tokens.npy, 2T + 1 tokens, window w = tokens[w*T :
w*T+T+1]) from a Zipf stream without the EOS id, with the EOS id written at 2 or 3
random places per window (window 1: one of them at its first input). Packing as
Megatron-LM's get_ltor_masks_and_position_ids with reset_position_ids,
reset_attention_mask and eod_mask_loss: a document starts after every EOS inside
the window (and at its first token); position_ids restart at 0 there; the model
runs with a 4-D additive mask (1, 1, T, T), 0 where key j is in query i's document
and j <= i, the f32 minimum elsewhere (block-diagonal causal); targets whose input
is EOS are -100.
  loss   per window: cross_entropy(logits, targets, ignore_index=-100) + coef * aux,
         aux = the family's load_balancing_loss_func(router logits, E, k,
         attention_mask=None): every token of the window counts, as tpr computes it
         (the CausalLM cannot take a 4-D mask into that function, so the decoder
         runs as model.model and the head and the loss are applied here).
  step   the mean over the W windows (backward on loss_w / W).
Checks: each document run alone (plain causal, positions from 0) gives the packed
run's logits for its tokens (the mask and the positions are the packing); the
plain causal run differs from it. Positions 0..T-1 under the same mask do NOT
differ beyond rounding (recorded): RoPE scores depend on q's and k's position
difference only, and the mask keeps both in one document, so a document's
constant shift cancels. What tpr's positions are is therefore checked without the
mask: records.controls.no_mask.loss is the loss with a plain causal mask and the
restarted positions (what `tpr train --pack --debug-pack no-mask` computes), and
no_mask_no_restart.loss the same with positions 0..T-1 (plain training with the
EOS targets masked), which differs.

Outputs: tokens.npy; step0_grads.safetensors: the step-0 gradient of every trained
tensor except the MLPs (experts and dense), the embedding and the lm head (to keep
the fixture small: attention, norms, routers, which the packing reaches through
every token), under checkpoint names; meta.json: the EOS id, the loss (records.loss[0]), the
hyperparameters test_train_family.c's harness passes, the checks.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_fixture import REPO, fail, load_for_training, save_tensors, zipf_tokens  # noqa: E402

GEN = "scripts/reference/make_pack_train_fixture.py"

FAMILIES = {
    # family: (class name, tiny checkpoint, seed, aux coef)
    "qwen3_moe": ("Qwen3MoeForCausalLM", "qwen3_moe_tiny", 1414, 0.05),
    "minimax_m2": ("MiniMaxM2ForCausalLM", "minimax_m2_tiny", 2236, 0.02),
    # MRoPE (sectioned), dense: every row of the (3, T) positions restarts alike, the
    # text rule of get_rope_index applied per document (a shift per document, which
    # the mask makes invisible, as for 1-D RoPE).
    "qwen2_vl": ("Qwen2VLForConditionalGeneration", "qwen2_vl_tiny", 2827, 0.0),
    # Lightning attention layers 0, 2, 3 beside softmax layer 1: packed = documents run alone. (With one
    # softmax layer the positions control is small on some data: this seed moves the no-mask loss by 1.4e-2.)
    "minimax": ("MiniMaxForCausalLM", "minimax_tiny", 3540, 0.05),
}
ALONE = {"minimax"}  # families whose packed window is its documents run alone (no 4-D mask form)
LM = "model.language_model."


def hub_name(family, n):
    """The name tpr trains a non-expert in-memory parameter under."""
    if family in ("minimax_m2", "minimax"):
        return n.replace(".mlp.gate.", ".block_sparse_moe.gate.")
    return "model." + n[len(LM):] if n.startswith(LM) else n


def kept(n, p):
    """The gradients the fixture keeps, to keep it small: attention, norms and routers; not the
    MLPs (experts or dense; the router's gate stays), the embedding, the lm head (nor a vision
    tower's, which sees no input). Every one of them sees every token through attention."""
    mlp = ".mlp." in n and ".mlp.gate.weight" not in n
    return not mlp and not n.endswith("embed_tokens.weight") and n != "lm_head.weight" and p.grad is not None


def packing(x, eos):
    """(positions (T,), lo (T,), document id (T,)) of window inputs x (T,)."""
    T = x.shape[0]
    pos, lo, doc = torch.zeros(T, dtype=torch.int64), torch.zeros(T, dtype=torch.int64), torch.zeros(T, dtype=torch.int64)
    start, d = 0, 0
    for i in range(T):
        lo[i], pos[i], doc[i] = start, i - start, d
        if int(x[i]) == eos:
            start, d = i + 1, d + 1
    return pos, lo, doc


def block_causal_mask(lo):
    """(1, 1, T, T) additive f32 mask: 0 where lo[i] <= j <= i, the f32 minimum elsewhere."""
    T = lo.shape[0]
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    ok = (j <= i) & (j >= lo[:, None])
    m = torch.zeros(T, T, dtype=torch.float32).masked_fill(~ok, torch.finfo(torch.float32).min)
    return m[None, None]


def run(model, mod, x, pos, mask, E, k):
    """(logits (T, V), aux) of inputs x (T,) with position_ids pos and a 4-D mask (None: transformers' own).
    MRoPE: every row of the (3, 1, T) position_ids is pos. A dense model: aux 0."""
    mrope = getattr(model.config, "text_config", None) is not None
    position_ids = pos[None, None, :].expand(3, 1, -1) if mrope else pos[None]
    extra = {"output_router_logits": True} if E else {}
    out = model.model(input_ids=x[None], attention_mask=mask, position_ids=position_ids, use_cache=False, **extra)
    logits = model.lm_head(out.last_hidden_state)[0]
    aux = mod.load_balancing_loss_func(out.router_logits, E, k, None) if E else torch.zeros(())
    return logits, aux


def run_alone(model, mod, x, doc, E, k, shift=False):
    """The packed window as its documents run alone, joined: (logits (T, V), aux). shift: each
    document at its window positions instead of from 0 (a control)."""
    logits, routers = [], []
    for d in range(int(doc.max()) + 1):
        idx = (doc == d).nonzero()[:, 0]
        pos = idx if shift else torch.arange(len(idx))
        out = model.model(input_ids=x[idx][None], position_ids=pos[None], use_cache=False, output_router_logits=True)
        logits.append(model.lm_head(out.last_hidden_state)[0])
        routers.append(out.router_logits)
    joined = tuple(torch.cat([r[L] for r in routers]) for L in range(len(routers[0])))
    return torch.cat(logits), mod.load_balancing_loss_func(joined, E, k, None)


def run_window(model, mod, x, pos, mask, E, k, alone):
    """The whole window at position_ids pos with a 4-D mask on the softmax layers; a family in
    ALONE: the lightning layers take none (their state runs over the window)."""
    if alone:
        mask = {"full_attention": mask, "linear_attention": None}
    return run(model, mod, x, pos, mask, E, k)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=sorted(FAMILIES), required=True)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    cls_name, tiny, seed, coef = FAMILIES[a.family]
    alone = a.family in ALONE
    out_dir = a.out or os.path.join(REPO, "tests", "fixtures", f"{a.family}_pack")
    # load_for_training reads these fields of an argparse namespace.
    args = argparse.Namespace(model=os.path.join(REPO, "tests", "fixtures", tiny), seed=seed, aux_coef=coef,
                              zipf=1.1)
    cls = getattr(transformers, cls_name)
    model, _ = load_for_training(cls, args)
    mod = sys.modules[cls.__module__]
    config = model.config.get_text_config()
    E = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", 0)  # 0: dense
    k, V = getattr(config, "num_experts_per_tok", 0), config.vocab_size
    T, W = 16, 2

    # ---- data: a Zipf stream without EOS, EOS written at random places
    gen = torch.Generator().manual_seed(seed + 1)
    eos = int(torch.randint(0, V, (1,), generator=gen))
    tokens, _ = zipf_tokens(V, W * T + 1, args)
    tokens[tokens == eos] = (eos + 1) % V
    for w in range(W):
        n = 2 + int(torch.randint(0, 2, (1,), generator=gen))
        places = torch.randperm(T - 1, generator=gen)[:n] + 1  # inputs 1 .. T-1
        if w == 1:
            places[0] = 0  # a window that starts with an EOS: its first token is a document of its own
        tokens[w * T + places] = eos

    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    problems, checks, losses, ces, auxes = [], {}, [], [], []
    doc_err = ctl_mask = ctl_pos = 0.0
    no_mask, no_mask_no_restart = [], []
    ce_sum, scored = 0.0, 0
    for w in range(W):
        x = tokens[w * T: w * T + T + 1]
        inputs, targets = x[:T], x[1:].clone()
        targets[inputs == eos] = -100
        pos, lo, doc = packing(inputs, eos)
        mask = block_causal_mask(lo)
        if alone:
            logits, aux = run_alone(model, mod, inputs, doc, E, k)
        else:
            logits, aux = run(model, mod, inputs, pos, mask, E, k)
        ce = F.cross_entropy(logits, targets, ignore_index=-100)
        loss_w = ce + coef * aux
        (loss_w / W).backward()
        losses.append(loss_w.item()), ces.append(ce.item()), auxes.append(aux.item())
        n = int((targets != -100).sum())
        ce_sum, scored = ce_sum + ce.item() * n, scored + n
        with torch.no_grad():
            for d in range(int(doc.max()) + 1):  # each document alone (ALONE: the packed run itself)
                idx = (doc == d).nonzero()[:, 0]
                one, _ = run(model, mod, inputs[idx], torch.arange(len(idx)), None, E, k)
                doc_err = max(doc_err, float((one - logits[idx]).abs().max()))
            # An explicit causal mask: given none, transformers finds packed documents from restarting
            # position_ids by itself (masking_utils.find_packed_sequence_indices).
            causal = block_causal_mask(torch.zeros(T, dtype=torch.int64))
            plain, plain_aux = run_window(model, mod, inputs, torch.arange(T), causal, E, k, alone)
            if alone:  # positions not restarted: each document at its window positions
                unrestarted, _ = run_alone(model, mod, inputs, doc, E, k, shift=True)
            else:
                unrestarted, _ = run(model, mod, inputs, torch.arange(T), mask, E, k)
            restarted, restarted_aux = run_window(model, mod, inputs, pos, causal, E, k, alone)
            ctl_mask = max(ctl_mask, float((plain - logits).abs().max()))
            ctl_pos = max(ctl_pos, float((unrestarted - logits).abs().max()))
            no_mask.append((F.cross_entropy(restarted, targets, ignore_index=-100) + coef * restarted_aux).item())
            no_mask_no_restart.append((F.cross_entropy(plain, targets, ignore_index=-100) + coef * plain_aux).item())
    if doc_err > 1e-5:
        problems.append(f"a document run alone differs from the packed run by {doc_err}")
    if ctl_mask < 1e-2:
        problems.append(f"the plain causal mask does not move the logits ({ctl_mask})")
    if abs(sum(no_mask) - sum(no_mask_no_restart)) / abs(sum(no_mask)) < 1e-3:
        problems.append("without the mask, restarting the positions does not move the loss")
    grads = {hub_name(a.family, n): p.grad.detach().float().contiguous() for n, p in params if kept(n, p)}
    if any(not bool((g != 0).any()) for g in grads.values()):
        problems.append("a kept tensor got no gradient")
    checks = {"documents_alone_vs_packed_logits_max_abs_diff": doc_err,
              "packed_window": "its documents run alone, joined" if alone else "one run with the 4-D mask",
              "plain_causal_vs_packed_logits_max_abs_diff": ctl_mask,
              "positions_not_restarted_vs_packed_logits_max_abs_diff": ctl_pos,
              "positions_not_restarted_why_small": "RoPE is relative and the mask keeps q and k in one document"}
    print(f"{a.family}: eos {eos}, loss {sum(losses) / W:.6f}; documents alone {doc_err:.2e}; controls: "
          f"plain causal {ctl_mask:.2e}, positions 0..T-1 under the mask {ctl_pos:.2e} (RoPE: relative); no mask: "
          f"loss {sum(no_mask) / W:.6f}, and positions 0..T-1 {sum(no_mask_no_restart) / W:.6f}; "
          f"{len(grads)} gradients kept")

    os.makedirs(out_dir, exist_ok=True)
    np.save(os.path.join(out_dir, "tokens.npy"), tokens.numpy().astype("<i4"))
    save_tensors(out_dir, {"step0_grads.safetensors": grads}, f"{GEN} --family {a.family}, transformers "
                 f"{transformers.__version__}")
    meta = {
        "generator": f"{GEN} --family {a.family}",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "model": {"class": f"transformers.{cls_name}", "checkpoint": f"tests/fixtures/{tiny}",
                  "router_aux_loss_coef": coef},
        "data": {"file": "tokens.npy", "seed": seed, "seq_len": T, "windows_per_step": W, "eos_id": eos,
                 "window": "window w = tokens[w*T : w*T+T+1]; inputs = first T, targets = last T",
                 "eos_places": [[int(i) for i in (tokens[w * T: w * T + T] == eos).nonzero()[:, 0]] for w in range(W)]},
        "packing": "Megatron-LM reset_position_ids + reset_attention_mask + eod_mask_loss: a document starts after "
                   "each EOS input; position_ids restart at 0 there; 4-D additive block-diagonal causal mask; "
                   "targets -100 where the input is EOS",
        "loss": {"per_window": "cross_entropy(logits, targets, ignore_index=-100) + router_aux_loss_coef * "
                               "load_balancing_loss_func(router_logits, E, k, attention_mask=None)",
                 "per_step": "mean over the W windows"},
        # The harness passes these to every run; step 0's gradient is taken before the optimizer.
        "optimizer": {"weight_decay": {"ndim>=2": 0.1}, "lr_schedule": {"lr_max": 3e-3, "warmup": 0,
                                                                        "min_lr": 3e-4, "total": 1},
                      "grad_clip": {"max_norm": 1.0}},
        "records": {"loss": [sum(losses) / W], "ce": [sum(ces) / W], "aux": [sum(auxes) / W],
                    "window_losses": losses,
                    "eval": {"loss": ce_sum / scored, "scored": scored,
                             "what": "validation of these windows before any update: the cross-entropy summed "
                                     "over the scored positions (inputs other than EOS) over their number"},
                    "controls": {"no_mask": {"loss": sum(no_mask) / W,
                                             "what": "plain causal mask, restarted positions, EOS targets -100"},
                                 "no_mask_no_restart": {"loss": sum(no_mask_no_restart) / W,
                                                        "what": "plain causal mask, positions 0..T-1, EOS targets "
                                                                "-100"}}},
        "files": {"step0_grads.safetensors": "step 0's gradient (mean over the W windows) of every trained tensor "
                                             "but the MLPs (the routers kept), the embedding and the lm head, "
                                             "checkpoint names"},
        "checks": checks,
        "problems": problems,
    }
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    if problems:
        for p in problems:
            print("PROBLEM:", p, file=sys.stderr)
        sys.exit(1)
    print(f"all checks passed; wrote {out_dir}")


if __name__ == "__main__":
    main()
