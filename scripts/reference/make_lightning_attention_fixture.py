#!/usr/bin/env python3
"""Writes tests/fixtures/lightning_attention/: transformers' own
MiniMaxLightningAttention (models/minimax/modeling_minimax.py) run on random
inputs, its core attention captured between the qkv projection and the output
norm, so test_lightning_attention compares tpr's lightning_attention and
lightning_decode ops with it (within 1e-5).

    scripts/reference/.venv/bin/python scripts/reference/make_lightning_attention_fixture.py \
        [--out-dir tests/fixtures/lightning_attention]

One module: H = 4 heads of D = 16, block_size 4, layer 1 of 3 (so the slope
factor is not 1), f32. Two calls:
  1. prefill: T = 19 tokens (4 full blocks and one of 3) from no cache, i.e.
     the zero state: transformers' block loop. q, k, v are the module's own
     act(qkv_proj(x)) split per head; out is the input of its output norm
     (a forward pre-hook on `norm`), state the returned attn_weights_inter.
  2. decode: T2 = 3 more tokens with a MiniMaxCache holding call 1's state:
     transformers' cached path, one token at a time.
Files (float32 .npy, (T, H, D) for per-token tensors, (H, D, D) for states):
slopes, q, k, v, out, state, then q2, k2, v2, out2, state2; meta.json.
"""
import argparse
import json
import os

import numpy as np
import torch
import transformers
from transformers.models.minimax.configuration_minimax import MiniMaxConfig
from transformers.models.minimax.modeling_minimax import MiniMaxCache, MiniMaxLightningAttention

H, D, BLOCK, LAYER, N_LAYERS, HIDDEN, T, T2 = 4, 16, 4, 1, 3, 48, 19, 3


def core(module, x, cache):
    """The module's q, k, v (T, H, D), core output (T, H, D) and state (H, D, D)."""
    captured = {}
    hook = module.norm.register_forward_pre_hook(lambda m, args: captured.update(core=args[0].detach().clone()))
    with torch.no_grad():
        qkv = module.act_fn(module.qkv_proj(x)).reshape(1, x.shape[1], H, 3 * D)
        q, k, v = torch.split(qkv, D, dim=3)
        _, state = module(x, None, None, past_key_values=cache)
    hook.remove()
    per_token = lambda t: t[0].numpy().astype(np.float32)  # (1, T, H, D) -> (T, H, D)
    out = captured["core"].reshape(1, x.shape[1], H, D)
    return per_token(q), per_token(k), per_token(v), per_token(out), state[0].detach().numpy().astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures",
                                                      "lightning_attention"))
    ap.add_argument("--seed", type=int, default=34)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    config = MiniMaxConfig(hidden_size=HIDDEN, num_attention_heads=H, head_dim=D, num_hidden_layers=N_LAYERS,
                           block_size=BLOCK, hidden_act="silu",
                           layer_types=["linear_attention"] * N_LAYERS, num_key_value_heads=H)
    module = MiniMaxLightningAttention(config, LAYER).float().eval()
    assert module.block_size == BLOCK and module.head_dim == D
    x1 = torch.randn(1, T, HIDDEN)
    x2 = torch.randn(1, T2, HIDDEN)

    q, k, v, out, state = core(module, x1, None)  # no cache: the block loop from the zero state
    cache = MiniMaxCache()
    cache.set_linear_cache(LAYER, torch.from_numpy(state.copy())[None])
    q2, k2, v2, out2, state2 = core(module, x2, cache)  # the cached (decode) path from that state

    os.makedirs(args.out_dir, exist_ok=True)
    arrays = dict(slopes=module.slope_rate.reshape(H).numpy().astype(np.float32), q=q, k=k, v=v, out=out,
                  state=state, q2=q2, k2=k2, v2=v2, out2=out2, state2=state2)
    for name, a in arrays.items():
        np.save(os.path.join(args.out_dir, name + ".npy"), np.ascontiguousarray(a, dtype="<f4"))
    meta = dict(heads=H, head_dim=D, block_size=BLOCK, layer_idx=LAYER, num_hidden_layers=N_LAYERS, T=T, T2=T2,
                seed=args.seed, torch=torch.__version__, transformers=transformers.__version__)
    with open(os.path.join(args.out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print("wrote", args.out_dir, {n: a.shape for n, a in arrays.items()})


if __name__ == "__main__":
    main()
