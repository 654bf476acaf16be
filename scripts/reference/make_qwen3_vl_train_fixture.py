#!/usr/bin/env python3
"""Writes the Qwen3-VL-MoE training golden fixture (tests/fixtures/qwen3_vl_moe_train):
AdamW steps of transformers' own Qwen3VLMoeForConditionalGeneration (its text
decoder: the vision tower gets no input and is not trained), started from the
committed tiny checkpoint (tests/fixtures/qwen3_vl_moe_tiny: interleaved MRoPE
with mrope_section [4, 2, 2], per-head q/k norms, 8 experts top-2), in f32 on CPU.

    scripts/reference/.venv/bin/python scripts/reference/make_qwen3_vl_train_fixture.py \
        --out tests/fixtures/qwen3_vl_moe_train

The recipe is make_qwen3_train_fixture.py's (tpr's train loop, train_fixture.py), on this model:
  positions  every window uses the same 3-D MRoPE positions (3, T) with an
             image-like block, as get_rope_index lays out text + one image:
             4 text tokens, a 2 x 4 grid (t constant, h/w varying, offset by
             the start position), then text at max + 1 (positions_3d.npy).
  loss       per window: out = model(input_ids=inputs[None], position_ids=pos3[:, None],
             output_router_logits=True); loss_w = cross_entropy(out.logits[0], targets)
             + coef * out.aux_loss, coef = text_config.router_aux_loss_coef set to
             --aux-coef; out.aux_loss is modeling_qwen3_vl_moe.load_balancing_loss_func
             (every layer's router logits, no mask), re-derived here in float64.
  step       mean over the windows of a step, clip_grad_norm_, AdamW(foreach=False,
             betas (0.9, 0.95), eps 1e-8, decay on ndim >= 2), warmup + cosine lr.
The router's gradient flows through the renormalised top-k probabilities
(Qwen3VLMoeTextTopKRouter always renormalises) and the aux loss.

Outputs, under the names tpr trains the text decoder by (its gradient dumps; the
Qwen3-MoE layout: "model.language_model." -> "model.", the fused experts
split per expert): tokens.npy, positions_3d.npy (i32 (3, T)),
step0_grads.safetensors, final_params.safetensors, meta.json (the keys
tests/train_harness.c reads, plus text_positions_step0_loss: step 0's loss
with transformers' text positions, every axis 0..T-1).
"""
import argparse
import os
import sys

import numpy as np
import torch
from transformers import Qwen3VLMoeForConditionalGeneration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from family_fixture import grid_positions  # noqa: E402
from train_fixture import (add_train_args, fail, fused_experts_to_hub, load_for_training,  # noqa: E402
                           run_train_fixture, save_pretrained_tensors, zipf_tokens)

GEN = "scripts/reference/make_qwen3_vl_train_fixture.py"
LM = "model.language_model."


def to_tpr(tensors):
    return fused_experts_to_hub({("model." + n[len(LM):] if n.startswith(LM) else n): t for n, t in tensors.items()})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_train_args(ap, "qwen3_vl_moe_train", "qwen3_vl_moe_tiny", seed=3141, steps=6, aux_coef=0.05, warmup=2)
    args = ap.parse_args()

    model, _ = load_for_training(Qwen3VLMoeForConditionalGeneration, args)
    tc = model.config.text_config
    tc.router_aux_loss_coef = args.aux_coef  # the loss reads the text config's coef
    if tc.attention_dropout != 0.0:
        fail(f"attention_dropout {tc.attention_dropout}: training mode is not deterministic")
    if not tc.rope_parameters.get("mrope_interleaved"):
        fail("the checkpoint's MRoPE is not interleaved")
    E, k, T = tc.num_experts, tc.num_experts_per_tok, args.seq_len
    pos3 = grid_positions(4, 2, 4, 4)
    if pos3.shape[1] != T:
        fail(f"the positions cover {pos3.shape[1]} tokens, --seq-len is {T}")
    if (pos3[1] == pos3[0]).all() or (pos3[2] == pos3[1]).all():
        fail("the 3-D positions do not differ per axis")

    # The text decoder's tensors as saved are its in-memory ones (fused experts).
    sp = save_pretrained_tensors(model)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad and not n.startswith("model.visual.")]
    for n, p in params:
        if n not in sp or not torch.equal(sp[n], p.detach()):
            fail(f"{n} is not saved as it is held")

    def forward_window(x, pos=pos3):
        out = model(input_ids=x[None], position_ids=pos[:, None, :], output_router_logits=True, use_cache=False)
        return out.logits[0], out.aux_loss, list(out.router_logits)

    # Step 0's loss with text positions (transformers' default for text:
    # every axis 0..T-1), before any update: what tpr train without
    # --positions-3d must give.
    tokens, _ = zipf_tokens(tc.vocab_size, args.steps * args.windows_per_step * T + 1, args)
    with torch.no_grad():
        text_losses = []
        for w in range(args.windows_per_step):
            x = tokens[w * T: w * T + T + 1]
            out = model(input_ids=x[:T][None], output_router_logits=True, use_cache=False)
            ce = torch.nn.functional.cross_entropy(out.logits[0], x[1:])
            text_losses.append((ce + args.aux_coef * out.aux_loss).item())
    text_loss0 = sum(text_losses) / len(text_losses)

    os.makedirs(args.out, exist_ok=True)
    np.save(os.path.join(args.out, "positions_3d.npy"), pos3.numpy().astype("<i4"))
    run_train_fixture(args, model, params, to_tpr, forward_window, E, k, GEN,
                      {"class": "transformers.Qwen3VLMoeForConditionalGeneration (text decoder)",
                       "checkpoint": "tests/fixtures/qwen3_vl_moe_tiny",
                       "names": "tpr's: model.language_model. -> model., experts split per expert"},
                      {"per_window": "cross_entropy(logits, targets) + text_config.router_aux_loss_coef * out.aux_loss",
                       "aux_function": "transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe."
                                       "load_balancing_loss_func (every layer's router logits)",
                       "positions": "positions_3d.npy (3, T), the same for every window"},
                      {"meta": {"text_positions_step0_loss": text_loss0,
                                "positions_3d": pos3.tolist()}})


if __name__ == "__main__":
    main()
