#!/usr/bin/env python3
"""Writes the Qwen3-VL-MoE golden-test fixture (tests/fixtures/qwen3_vl_moe_tiny):
the text decoder of a tiny random Qwen3VLMoeForConditionalGeneration built
with Hugging Face transformers' own classes, and its logits on a text prompt
with 3-D (temporal, height, width) MRoPE positions that contain an image-like
block: 3 text tokens, a 2x3 grid (t constant, h/w varying, offset by the
start position as get_rope_index does), then text continuing at max + 1.

    scripts/reference/.venv/bin/python scripts/reference/make_qwen3_vl_moe_fixture.py

Outputs:
  config.json        what save_pretrained writes (model_type qwen3_vl_moe,
                     text_config nested, rope_parameters with mrope_section
                     and mrope_interleaved)
  model.safetensors  what save_pretrained writes, untouched: the text decoder
                     under model.language_model.*, lm_head.weight, the fused
                     experts mlp.experts.gate_up_proj (E, 2F, H) and down_proj
                     (E, H, F) (the module's layout: transformers 5.23 writes
                     them as it holds them; hub releases hold them transposed,
                     (E, H, 2F) / (E, F, H), and tpr reads both), and the
                     vision tower's model.visual.* (not run by tpr). The
                     references come from the model transformers saved and
                     reloaded from this very file.
  reference.safetensors
      tokens (i64 [T]), pos3 (i64 [3, T]) the MRoPE positions, logits
      [T, V] f32 from the language model called with position_ids = pos3;
      greedy (i64 [G]) the next G greedy tokens, each at MRoPE position
      max(pos3) + 1 + j on every axis (transformers' rope_deltas),
      greedy_logits [G, V] the logits each was chosen from;
      text_tokens (i64 [Tt]) a text-only prompt, text_greedy (i64 [Gt]) what
      Qwen3VLMoeForConditionalGeneration.generate (greedy, KV cache; its own
      text-only position ids) continues it with, text_greedy_logits [Gt, V].
"""
import json
import os

import torch
import transformers
from safetensors import safe_open
from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

from family_fixture import (check_size, fail, fixture_bytes, randomize, save_and_reload, seeded, tensor_names,
                            vl_fixture_args, vl_greedy_references, vl_lm_logits, vl_prompts, write_reference)


TEXT = dict(vocab_size=96, hidden_size=32, intermediate_size=64, moe_intermediate_size=8, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
            rms_norm_eps=1e-6, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2],
                             "mrope_interleaved": True})
VISION = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=32, patch_size=4,
              spatial_merge_size=2, temporal_patch_size=2, deepstack_visual_indexes=[0], num_position_embeddings=16)


def main():
    args = vl_fixture_args(__doc__, "qwen3_vl_moe", seed=2718)

    gen = seeded(args.seed)

    config = Qwen3VLMoeConfig(text_config=TEXT, vision_config=VISION, tie_word_embeddings=False)
    tc = config.text_config
    if tc.hidden_size in (tc.moe_intermediate_size, 2 * tc.moe_intermediate_size):
        fail("F == H or 2F == H makes the fused expert layout ambiguous; pick other sizes")
    model = Qwen3VLMoeForConditionalGeneration(config).float().eval()
    model.set_attn_implementation("eager")
    randomize(model, gen, "mlp.gate.weight", visual_scale=0.02)

    pos3, tokens, text_tokens = vl_prompts(gen, tc.vocab_size, args.text_len)
    T = pos3.shape[1]
    ref, _ = save_and_reload(model, Qwen3VLMoeForConditionalGeneration, args.out, "qwen3vl_fixture_")
    emb = ref.model.language_model.embed_tokens.weight
    if ref.lm_head.weight.data_ptr() == emb.data_ptr():
        fail("lm_head is tied to embed_tokens; the fixture wants them apart")

    out = {"tokens": tokens, "pos3": pos3, "logits": vl_lm_logits(ref, tokens, pos3)}
    # Controls measured here too: 1-D positions must give other logits.
    flat = torch.arange(T)[None, :].expand(3, -1)
    d_flat = float((vl_lm_logits(ref, tokens, flat) - out["logits"]).abs().max())
    vl_greedy_references(ref, tokens, pos3, args.gen, text_tokens, args.text_gen, out)
    top2 = torch.cat([out["greedy_logits"], out["text_greedy_logits"]]).topk(2, dim=-1).values
    write_reference(args.out, out)
    size = fixture_bytes(args.out)
    names = tensor_names(args.out)
    with safe_open(os.path.join(args.out, "model.safetensors"), "pt") as f:
        fused = {k: list(f.get_slice(k).get_shape()) for k in names if k.endswith("layers.0.mlp.experts.gate_up_proj")
                 or k.endswith("layers.0.mlp.experts.down_proj")}
    if not any(k.startswith("model.language_model.") for k in names) or len(fused) != 2:
        fail(f"save_pretrained did not write the native layout: {names[:6]}")
    print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__, "seed": args.seed,
                      "T": T, "pos3": pos3.tolist(), "tensors": len(names), "first_tensors": names[:4], "fused_experts": fused,
                      "max_abs_logit_change_with_1d_positions": d_flat, "greedy": out["greedy"].tolist(), "text_greedy": out["text_greedy"].tolist(),
                      "greedy_min_margin": float((top2[:, 0] - top2[:, 1]).min()), "bytes": size}, indent=1))
    if d_flat < 1e-3:
        fail("1-D positions give the same logits; the prompt does not exercise MRoPE")
    check_size(size)


if __name__ == "__main__":
    main()
