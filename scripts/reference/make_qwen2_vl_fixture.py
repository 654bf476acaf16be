#!/usr/bin/env python3
"""Writes the Qwen2-VL golden-test fixture (tests/fixtures/qwen2_vl_tiny):
the text decoder of a tiny random Qwen2VLForConditionalGeneration built with
Hugging Face transformers' own classes (a dense Qwen2 with q/k/v biases and
SECTIONED MRoPE), and its logits on a text prompt with 3-D (temporal, height,
width) positions that contain an image-like block: 3 text tokens, a 2x3 grid
(t constant, h/w varying, offset by the start position as get_rope_index
does), then text continuing at max + 1.

    scripts/reference/.venv/bin/python scripts/reference/make_qwen2_vl_fixture.py

Shapes chosen to exercise the sharding plan: 6 query heads over 2 KV heads,
so tp 4 pads Q to 8 heads (interleaved, one zero head after each group of 3)
and replicates each KV head twice -- the q/k/v biases must be sliced exactly
like their weights' rows; vocab 90 pads to 92 at tp 4.

Outputs:
  config.json        what save_pretrained writes (model_type qwen2_vl,
                     text_config nested with rope_parameters.mrope_section)
  model.safetensors  what save_pretrained writes, untouched: the text decoder
                     under the hub's names model.layers.* (q/k/v .bias included),
                     lm_head.weight, the vision tower's model.visual.* (not
                     run by tpr)
  reference.safetensors
      tokens (i64 [T]), pos3 (i64 [3, T]), logits [T, V] f32 from the language
      model called with position_ids = pos3; greedy (i64 [G]) the next G
      greedy tokens, each at position max(pos3) + 1 + j on every axis
      (transformers' rope_deltas), greedy_logits [G, V]; text_tokens (i64
      [Tt]), text_greedy (i64 [Gt]) what Qwen2VLForConditionalGeneration.
      generate continues a text-only prompt with, text_greedy_logits [Gt, V].
The references come from the model transformers saved and reloaded.
"""
import json

import torch
import transformers
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

from family_fixture import (check_size, fail, fixture_bytes, randomize, save_and_reload, seeded, tensor_names,
                            vl_fixture_args, vl_greedy_references, vl_lm_logits, vl_prompts, write_reference)

# head_dim = hidden_size / num_attention_heads (Qwen2VLAttention ignores a head_dim key).
TEXT = dict(vocab_size=90, hidden_size=96, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=64, bos_token_id=None, eos_token_id=None,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]})
VISION = dict(depth=1, embed_dim=16, hidden_size=96, mlp_ratio=1, num_heads=2, patch_size=4, spatial_merge_size=2,
              temporal_patch_size=2)


def main():
    args = vl_fixture_args(__doc__, "qwen2_vl", seed=1618)

    gen = seeded(args.seed)
    config = Qwen2VLConfig(text_config=TEXT, vision_config=VISION, tie_word_embeddings=False)
    tc = config.text_config
    model = Qwen2VLForConditionalGeneration(config).float().eval()
    model.set_attn_implementation("eager")
    randomize(model, gen, None, visual_scale=0.02)

    pos3, tokens, text_tokens = vl_prompts(gen, tc.vocab_size, args.text_len)
    T = pos3.shape[1]
    ref, _ = save_and_reload(model, Qwen2VLForConditionalGeneration, args.out, "qwen2vl_fixture_")
    if ref.lm_head.weight.data_ptr() == ref.model.language_model.embed_tokens.weight.data_ptr():
        fail("lm_head is tied to embed_tokens; the fixture wants them apart")
    names = tensor_names(args.out)
    # transformers 5.23 writes Qwen2-VL's decoder under the hub's names (model.layers.*); tpr reads
    # model.language_model.* as well.
    biases = [n for n in names if n.startswith("model.") and "visual" not in n and n.endswith("_proj.bias")]
    if len(biases) != 3 * tc.num_hidden_layers:
        fail(f"expected q/k/v biases in every layer, found {biases}")

    out = {"tokens": tokens, "pos3": pos3, "logits": vl_lm_logits(ref, tokens, pos3)}
    # What the controls should see: 1-D positions and biases left out change the logits.
    flat = torch.arange(T)[None, :].expand(3, -1)
    d_flat = float((vl_lm_logits(ref, tokens, flat) - out["logits"]).abs().max())
    saved = {}
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if n.endswith("_proj.bias"):
                saved[n] = p.clone()
                p.zero_()
        d_bias = float((vl_lm_logits(ref, tokens, pos3) - out["logits"]).abs().max())
        for n, p in ref.named_parameters():
            if n in saved:
                p.copy_(saved[n])
    vl_greedy_references(ref, tokens, pos3, args.gen, text_tokens, args.text_gen, out)
    top2 = torch.cat([out["greedy_logits"], out["text_greedy_logits"]]).topk(2, dim=-1).values
    write_reference(args.out, out)
    size = fixture_bytes(args.out)
    scale = float(out["logits"].abs().max())
    print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__, "seed": args.seed,
                      "T": T, "pos3": pos3.tolist(), "tensors": len(names), "first_tensors": names[:4],
                      "rel_change_1d_positions": d_flat / scale, "rel_change_no_biases": d_bias / scale,
                      "greedy": out["greedy"].tolist(), "text_greedy": out["text_greedy"].tolist(),
                      "greedy_min_margin": float((top2[:, 0] - top2[:, 1]).min()), "bytes": size}, indent=1))
    if d_flat < 1e-3 or d_bias < 1e-3:
        fail("1-D positions or zero biases give the same logits; the fixture does not exercise them")
    check_size(size)


if __name__ == "__main__":
    main()
