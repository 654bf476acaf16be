#!/usr/bin/env python3
"""Writes the Qwen2-VL training golden fixture (tests/fixtures/qwen2_vl_train):
AdamW steps of transformers' own Qwen2VLForConditionalGeneration (its text
decoder: the vision tower gets no input and is not trained), started from the
committed tiny checkpoint (tests/fixtures/qwen2_vl_tiny: a dense Qwen2 with
q/k/v biases, SECTIONED MRoPE with mrope_section [4, 2, 2], 6 query heads over
2 KV heads), in f32 on CPU.

    scripts/reference/.venv/bin/python scripts/reference/make_qwen2_vl_train_fixture.py \
        --out tests/fixtures/qwen2_vl_train

The recipe is make_qwen3_vl_train_fixture.py's (tpr's train loop, train_fixture.py), on this model:
  positions  every window the same image-like 3-D positions (3, T)
             (train_fixture.train_grid_positions; positions_3d.npy).
  loss       per window: logits = model(input_ids=inputs[None], position_ids=pos3[:, None]).logits;
             loss_w = cross_entropy(logits[0], targets). The model has no router and
             no aux loss: checked here, its own loss (labels=) is the cross-entropy alone.
  step       mean over the windows of a step, clip_grad_norm_, AdamW(foreach=False,
             betas (0.9, 0.95), eps 1e-8, decay on ndim >= 2: the biases get none),
             warmup + cosine lr.

Outputs, under the names tpr trains and saves the text decoder by (the hub's:
"model.language_model." -> "model."): tokens.npy, positions_3d.npy (i32 (3, T)),
step0_grads.safetensors, final_params.safetensors, meta.json (the keys
tests/train_harness.c reads, plus text_positions_step0_loss: step 0's loss
with transformers' text positions, every axis 0..T-1).
"""
import os
import sys

import torch
from transformers import Qwen2VLForConditionalGeneration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_fixture import (fail, parse_and_load, run_vl_train_fixture, save_pretrained_tensors,  # noqa: E402
                           text_positions_step0_loss, train_grid_positions, zipf_tokens)

GEN = "scripts/reference/make_qwen2_vl_train_fixture.py"
LM = "model.language_model."


def to_tpr(tensors):
    return {("model." + n[len(LM):] if n.startswith(LM) else n): t.detach().float().contiguous()
            for n, t in tensors.items()}


def main():
    args, model, _ = parse_and_load(__doc__, Qwen2VLForConditionalGeneration, "qwen2_vl_train", "qwen2_vl_tiny",
                                    no_aux="Qwen2-VL has no router: --aux-coef must be 0",
                                    seed=2721, steps=6, aux_coef=0.0, warmup=2)
    tc = model.config.text_config
    if tc.rope_parameters.get("mrope_interleaved") or tc.rope_parameters.get("mrope_section") is None:
        fail("the checkpoint's MRoPE is not sectioned")
    T = args.seq_len
    pos3 = train_grid_positions(T)

    sp = save_pretrained_tensors(model)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad and not n.startswith("model.visual.")]
    hub = to_tpr(dict(params))
    for n, p in params:
        h = "model." + n[len(LM):] if n.startswith(LM) else n
        if h not in sp or not torch.equal(sp[h], p.detach()):
            fail(f"{n} is not saved as {h} as it is held")
    biases = [n for n in hub if n.endswith("_proj.bias")]
    if len(biases) != 3 * tc.num_hidden_layers:
        fail(f"expected q/k/v biases in every layer, found {biases}")

    def forward_window(x, pos=pos3):
        out = model(input_ids=x[None], position_ids=pos[:, None, :], use_cache=False)
        return out.logits[0], None, []

    tokens, _ = zipf_tokens(tc.vocab_size, args.steps * args.windows_per_step * T + 1, args)
    with torch.no_grad():
        # The model's own loss is the cross-entropy alone (no aux term): its
        # shifted labels against ours on the first T - 1 targets.
        x = tokens[: T + 1]
        out = model(input_ids=x[:T][None], position_ids=pos3[:, None, :], labels=x[:T][None], use_cache=False)
        mine = torch.nn.functional.cross_entropy(out.logits[0, :-1], x[1:T])
        if abs(out.loss.item() - mine.item()) > 1e-6 * abs(mine.item()):
            fail(f"the model's loss {out.loss.item()} is not the cross-entropy {mine.item()}")

    def text_window_loss(x):
        out = model(input_ids=x[:T][None], use_cache=False)
        return torch.nn.functional.cross_entropy(out.logits[0], x[1:])

    text_loss0 = text_positions_step0_loss(tokens, args, text_window_loss)
    run_vl_train_fixture(args, model, params, to_tpr, forward_window, 0, 0, GEN,
                         {"class": "transformers.Qwen2VLForConditionalGeneration (text decoder)",
                          "checkpoint": "tests/fixtures/qwen2_vl_tiny",
                          "names": "the hub's: model.language_model. -> model."},
                         {"per_window": "cross_entropy(logits, targets) (the model's own loss; no router, no aux loss)",
                          "positions": "positions_3d.npy (3, T), the same for every window"},
                         pos3, text_loss0)
    check_no_tiny_grads(args.out)


def check_no_tiny_grads(out):
    """Step 0's AdamW update is lr * g / (|g| + eps): where a gradient element
    is within a few eps (1e-8) of zero but not zero, it turns f32 rounding
    differences (~1e-9 here) into parameter differences of up to lr * dg / eps,
    above the 1e-4 bound of the steps test, whatever the implementation. The
    fixture must have none (exact zeros, unseen tokens' embedding rows, are
    exact in both); another --seed draws other windows."""
    from safetensors.torch import load_file
    tiny = []
    for n, g in load_file(os.path.join(out, "step0_grads.safetensors")).items():
        a = g.abs()
        k = int(((a > 0) & (a < 1e-7)).sum())
        if k:
            tiny.append(f"{n}: {k} (min {float(a[a > 0].min()):.1e})")
    if tiny:
        fail("step-0 gradient elements within 10 eps of zero (AdamW amplifies rounding there): " + "; ".join(tiny))


if __name__ == "__main__":
    main()
