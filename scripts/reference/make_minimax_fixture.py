#!/usr/bin/env python3
"""Writes the MiniMax (MiniMax-Text-01, transformers' `minimax`) golden-test
fixture (tests/fixtures/minimax_tiny): a tiny random checkpoint built with
transformers' own MiniMaxForCausalLM, and that model's outputs on it.

    scripts/reference/.venv/bin/python scripts/reference/make_minimax_fixture.py

Config: configs/minimax_tiny.json -- 4 layers, layer_types linear, full,
linear, linear (hybrid: lightning attention beside softmax attention),
block_size 4 so the prompts (11 and 5 tokens) span several blocks and end in
a partial one, 4 heads of head_dim 8 over hidden 48 (nq * D != H), GQA
(2 KV heads) in the softmax layer, 4 experts top-2, and residual factors
(*_alpha_factor / *_beta_factor) all different from 1 and from each other,
so a factor used in the wrong place shows.

A second fixture (tests/fixtures/minimax_tiny_b) comes from
configs/minimax_tiny_b.json: 3 layers linear, linear, full, block_size 3,
8 heads of head_dim 64/8 (head_dim from hidden_size), 4 KV heads, 8 experts
top-3, tied embeddings, other residual factors:

    scripts/reference/.venv/bin/python scripts/reference/make_minimax_fixture.py \
        --config configs/minimax_tiny_b.json --out tests/fixtures/minimax_tiny_b \
        --seed 1789 --require-head-dim-apart 0

Outputs:
  config.json, model.safetensors   what save_pretrained writes (hub naming:
      model.layers.L.block_sparse_moe.experts.E.w1.weight, self_attn.qkv_proj,
      ...; the lightning layers' decay buffers are not persistent weights tpr reads)
  reference.safetensors
      tokens_a (i64 [Ta]), logits_a [Ta, V] f32; tokens_b (i64 [Tb]), logits_b;
      greedy_a (i64 [G]) the next G greedy tokens after tokens_a (generate with
      MiniMaxCache), greedy_logits_a [G, V] the logits each one was chosen from.
The references come from the model reloaded with from_pretrained, so they
belong to the bytes on disk.
"""
import argparse
import json
import math
import os
import sys

import torch
import transformers
from transformers import MiniMaxConfig, MiniMaxForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from family_fixture import (REPO, check_reloaded, check_size, fail, fixture_bytes, forward_logits,  # noqa: E402
                            save_checkpoint, seeded, tensor_names, write_reference)


def randomize(model, gen):
    """Every parameter drawn fresh from gen in named_parameters order; the
    buffers (slopes and decays, functions of the config) are kept."""
    with torch.no_grad():
        for name, t in model.named_parameters():
            shape = tuple(t.shape)
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                v = 1.0 + 0.3 * torch.randn(shape, generator=gen)  # RMSNorm gains around 1, not ones
            elif name.endswith("embed_tokens.weight"):
                v = torch.randn(shape, generator=gen)
            elif name.endswith("mlp.gate.weight"):
                v = 1.5 * torch.randn(shape, generator=gen) / math.sqrt(shape[-1])  # router logits ~ N(0, 1.5^2)
            elif t.dim() in (2, 3):
                v = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])  # Linear / fused experts (.., out, in)
            else:
                fail(f"no initialisation rule for {name} {shape}")
            t.copy_(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "minimax_tiny"))
    ap.add_argument("--config", default=os.path.join(REPO, "configs", "minimax_tiny.json"))
    ap.add_argument("--seed", type=int, default=3407)
    ap.add_argument("--len-a", type=int, default=11)
    ap.add_argument("--len-b", type=int, default=5)
    ap.add_argument("--gen", type=int, default=6)
    ap.add_argument("--require-head-dim-apart", type=int, default=1,
                    help="1: fail unless heads * head_dim != hidden_size (0 for configs that keep them equal)")
    args = ap.parse_args()

    gen = seeded(args.seed)
    with open(args.config) as f:
        cfg = {k: v for k, v in json.load(f).items() if k not in ("architectures", "model_type", "torch_dtype")}
    cfg["bos_token_id"] = cfg["eos_token_id"] = cfg["pad_token_id"] = None  # hub ids lie outside a tiny vocabulary
    config = MiniMaxConfig(**cfg)
    types = list(config.layer_types)
    if "linear_attention" not in types or "full_attention" not in types:
        fail(f"layer_types {types} is not hybrid")
    if args.require_head_dim_apart and config.head_dim * config.num_attention_heads == config.hidden_size:
        fail("head_dim equals hidden_size / num_attention_heads; the fixture wants them apart")
    model = MiniMaxForCausalLM(config).float().eval()
    model.set_attn_implementation("eager")
    model.set_experts_implementation("eager")
    randomize(model, gen)

    V = config.vocab_size
    tokens_a = torch.randint(0, V, (args.len_a,), generator=gen, dtype=torch.int64)
    tokens_b = torch.randint(0, V, (args.len_b,), generator=gen, dtype=torch.int64)
    if args.len_a <= config.block_size or args.len_a % config.block_size == 0:
        fail("prompt a must span several blocks and end in a partial one")

    save_checkpoint(model, args.out, "minimax_fixture_")
    ref = MiniMaxForCausalLM.from_pretrained(args.out, dtype=torch.float32, attn_implementation="eager",
                                             experts_implementation="eager").eval()
    check_reloaded(model, ref)
    names = tensor_names(args.out)
    out = {"tokens_a": tokens_a, "tokens_b": tokens_b}
    out["logits_a"] = forward_logits(ref, tokens_a)
    out["logits_b"] = forward_logits(ref, tokens_b)
    with torch.no_grad():
        g = ref.generate(tokens_a[None, :], max_new_tokens=args.gen, min_new_tokens=args.gen, do_sample=False,
                         num_beams=1, use_cache=True, output_logits=True, return_dict_in_generate=True)
    greedy = g.sequences[0, args.len_a:].clone()
    if greedy.shape[0] != args.gen:
        fail(f"generate returned {greedy.shape[0]} tokens, wanted {args.gen}")
    out["greedy_a"] = greedy.to(torch.int64)
    out["greedy_logits_a"] = torch.stack([x[0].float() for x in g.logits])

    # Self-checks: the cached generation equals uncached full forwards (the
    # cache's recurrent path vs the block loop), and each residual factor
    # matters (setting it to 1 moves the logits).
    seq, worst = tokens_a.clone(), 0.0
    for i in range(args.gen):
        lg = forward_logits(ref, seq)[-1]
        worst = max(worst, float((lg - out["greedy_logits_a"][i]).abs().max()))
        seq = torch.cat([seq, lg.argmax()[None]])
    if not torch.equal(seq[args.len_a:], greedy):
        fail("greedy with the cache differs from greedy without it")
    moved = {}
    for attr in ("attn_alpha_factor", "attn_beta_factor", "mlp_alpha_factor", "mlp_beta_factor"):
        layer = ref.model.layers[0]
        keep = getattr(layer, attr)
        setattr(layer, attr, 1.0)
        moved[attr] = float((forward_logits(ref, tokens_a) - out["logits_a"]).abs().max())
        setattr(layer, attr, keep)
        if moved[attr] < 1e-2:
            fail(f"layer 0's {attr} barely matters ({moved[attr]})")
    write_reference(args.out, out)
    size = fixture_bytes(args.out)
    top2 = out["greedy_logits_a"].topk(2, dim=-1).values
    print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__, "seed": args.seed,
                      "layer_types": types, "block_size": config.block_size, "tensors": len(names),
                      "names": [n for n in names if "layers.0." in n or "layers.1." in n],
                      "greedy_a": greedy.tolist(), "cached_vs_uncached_max_abs": worst,
                      "factor_set_to_1_moves_logits_by": moved,
                      "greedy_min_margin": float((top2[:, 0] - top2[:, 1]).min()), "bytes": size}, indent=1))
    check_size(size)


if __name__ == "__main__":
    main()
