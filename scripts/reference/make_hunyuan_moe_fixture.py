#!/usr/bin/env python3
"""Writes the Hunyuan-MoE golden-test fixture (tests/fixtures/hunyuan_moe_tiny):
a tiny random checkpoint built with Hugging Face transformers' own
HunYuanMoEV1ForCausalLM (config: configs/hunyuan_moe_tiny.json -- nq != nkv,
8 experts top-2 beside the shared MLP, query/key layernorm after RoPE -- with
head_dim overridden to 8 (--head-dim) so that nq * head_dim != hidden_size:
the config file keeps 16), and that model's outputs on it.

    scripts/reference/.venv/bin/python scripts/reference/make_hunyuan_moe_fixture.py

Outputs:
  config.json         what save_pretrained writes (transformers' keys)
  model.safetensors   save_pretrained's single file, per-expert hub naming
  reference.safetensors
      tokens_a (i64 [Ta]), logits_a [Ta, V] f32; tokens_b (i64 [Tb]), logits_b;
      greedy_a (i64 [G]) the next G greedy tokens after tokens_a (generate,
      KV cache), greedy_logits_a [G, V] the logits each one was chosen from.
The references come from the model reloaded with from_pretrained, so they
belong to the bytes on disk. Model on make_qwen3_moe_fixture.py.
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import HunYuanMoEV1Config, HunYuanMoEV1ForCausalLM

transformers.utils.logging.disable_progress_bar()
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def fail(msg):
    print(f"make_hunyuan_moe_fixture: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def randomize(model, gen):
    """Every parameter drawn fresh from `gen`, in state_dict order."""
    new = {}
    for name, t in model.state_dict().items():
        shape = tuple(t.shape)
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            v = 1.0 + 0.3 * torch.randn(shape, generator=gen)  # RMSNorm gains around 1, not ones
        elif name.endswith("embed_tokens.weight"):
            v = torch.randn(shape, generator=gen)
        elif name.endswith("mlp.gate.wg.weight"):
            v = 1.5 * torch.randn(shape, generator=gen) / math.sqrt(shape[-1])  # router logits ~ N(0, 1.5^2)
        elif t.dim() in (2, 3):
            v = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])  # Linear / fused experts (.., out, in)
        else:
            fail(f"no initialisation rule for {name} {shape}")
        new[name] = v.to(t.dtype)
    model.load_state_dict(new, strict=True)


def forward_logits(model, tokens):
    with torch.no_grad():
        return model(tokens[None, :], use_cache=False).logits[0].float()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "hunyuan_moe_tiny"))
    ap.add_argument("--config", default=os.path.join(REPO, "configs", "hunyuan_moe_tiny.json"))
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--len-a", type=int, default=11)
    ap.add_argument("--len-b", type=int, default=5)
    ap.add_argument("--gen", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=8, help="overrides the config's head_dim (0: keep it)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    with open(args.config) as f:
        cfg = {k: v for k, v in json.load(f).items() if k not in ("architectures", "model_type", "torch_dtype")}
    if args.head_dim:
        cfg["head_dim"] = args.head_dim
    config = HunYuanMoEV1Config(**cfg)
    if config.head_dim * config.num_attention_heads == config.hidden_size:
        fail("the config's head_dim equals hidden_size / num_attention_heads; the fixture wants them apart")
    model = HunYuanMoEV1ForCausalLM(config).float().eval()
    model.set_attn_implementation("eager")
    model.set_experts_implementation("eager")
    randomize(model, gen)
    if not all(hasattr(l.mlp, "shared_mlp") for l in model.model.layers):
        fail("a layer without the shared MLP")

    V = config.vocab_size
    tokens_a = torch.randint(0, V, (args.len_a,), generator=gen, dtype=torch.int64)
    tokens_b = torch.randint(0, V, (args.len_b,), generator=gen, dtype=torch.int64)

    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="hunyuan_fixture_")
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        for f in ("config.json", "model.safetensors"):
            shutil.copyfile(os.path.join(tmp, f), os.path.join(args.out, f))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    ref = HunYuanMoEV1ForCausalLM.from_pretrained(args.out, dtype=torch.float32, attn_implementation="eager",
                                              experts_implementation="eager").eval()
    rsd, msd = ref.state_dict(), model.state_dict()
    for n, t in msd.items():
        if not torch.equal(rsd[n], t):
            fail(f"reloaded {n} differs from the generated weight")
    with safe_open(os.path.join(args.out, "model.safetensors"), "pt") as f:
        names = sorted(f.keys())
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
    top2 = out["greedy_logits_a"].topk(2, dim=-1).values
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(args.out, "reference.safetensors"))
    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__, "seed": args.seed,
                      "tensors": len(names), "first_tensors": names[:6],
                      "greedy_a": greedy.tolist(), "greedy_min_margin": float((top2[:, 0] - top2[:, 1]).min()),
                      "bytes": size}, indent=1))
    if size > 1 << 20:
        fail(f"the fixture takes {size} bytes, over 1 MB")


if __name__ == "__main__":
    main()
