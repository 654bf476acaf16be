#!/usr/bin/env python3
"""Writes the Qwen3-VL-MoE training golden fixture (tests/fixtures/qwen3_vl_moe_train):
AdamW steps of transformers' own Qwen3VLMoeForConditionalGeneration (its text
decoder: the vision tower gets no input and is not trained), started from the
committed tiny checkpoint (tests/fixtures/qwen3_vl_moe_tiny: interleaved MRoPE
with mrope_section [4, 2, 2], per-head q/k norms, 8 experts top-2), in f32 on CPU.

    scripts/reference/.venv/bin/python scripts/reference/make_qwen3_vl_train_fixture.py \
        --out tests/fixtures/qwen3_vl_moe_train

The recipe is make_qwen3_train_fixture.py's (tpr's train loop, train_fixture.py), on this model:
  positions  every window the same image-like 3-D positions (3, T)
             (train_fixture.train_grid_positions; positions_3d.npy).
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
import os
import sys

import torch
from transformers import Qwen3VLMoeForConditionalGeneration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_fixture import (fail, fused_experts_to_hub, parse_and_load, run_vl_train_fixture,  # noqa: E402
                           save_pretrained_tensors, text_positions_step0_loss, train_grid_positions, zipf_tokens)

GEN = "scripts/reference/make_qwen3_vl_train_fixture.py"
LM = "model.language_model."


def to_tpr(tensors):
    return fused_experts_to_hub({("model." + n[len(LM):] if n.startswith(LM) else n): t for n, t in tensors.items()})


def main():
    args, model, _ = parse_and_load(__doc__, Qwen3VLMoeForConditionalGeneration, "qwen3_vl_moe_train",
                                    "qwen3_vl_moe_tiny", seed=3141, steps=6, aux_coef=0.05, warmup=2)
    tc = model.config.text_config
    tc.router_aux_loss_coef = args.aux_coef  # the loss reads the text config's coef
    if not tc.rope_parameters.get("mrope_interleaved"):
        fail("the checkpoint's MRoPE is not interleaved")
    E, k, T = tc.num_experts, tc.num_experts_per_tok, args.seq_len
    pos3 = train_grid_positions(T)

    # The text decoder's tensors as saved are its in-memory ones (fused experts).
    sp = save_pretrained_tensors(model)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad and not n.startswith("model.visual.")]
    for n, p in params:
        if n not in sp or not torch.equal(sp[n], p.detach()):
            fail(f"{n} is not saved as it is held")

    def forward_window(x, pos=pos3):
        out = model(input_ids=x[None], position_ids=pos[:, None, :], output_router_logits=True, use_cache=False)
        return out.logits[0], out.aux_loss, list(out.router_logits)

    def text_window_loss(x):
        out = model(input_ids=x[:T][None], output_router_logits=True, use_cache=False)
        ce = torch.nn.functional.cross_entropy(out.logits[0], x[1:])
        return ce + args.aux_coef * out.aux_loss

    tokens, _ = zipf_tokens(tc.vocab_size, args.steps * args.windows_per_step * T + 1, args)
    text_loss0 = text_positions_step0_loss(tokens, args, text_window_loss)
    run_vl_train_fixture(args, model, params, to_tpr, forward_window, E, k, GEN,
                         {"class": "transformers.Qwen3VLMoeForConditionalGeneration (text decoder)",
                          "checkpoint": "tests/fixtures/qwen3_vl_moe_tiny",
                          "names": "tpr's: model.language_model. -> model., experts split per expert"},
                         {"per_window": "cross_entropy(logits, targets) + text_config.router_aux_loss_coef * "
                                        "out.aux_loss",
                          "aux_function": "transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe."
                                          "load_balancing_loss_func (every layer's router logits)",
                          "positions": "positions_3d.npy (3, T), the same for every window"},
                         pos3, text_loss0)


if __name__ == "__main__":
    main()
