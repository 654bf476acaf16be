#!/usr/bin/env python3
"""Writes the Hunyuan-MoE golden-test fixture (tests/fixtures/hunyuan_moe_tiny):
a tiny random checkpoint built with Hugging Face transformers' own
HunYuanMoEV1ForCausalLM (config: configs/hunyuan_moe_tiny.json -- nq != nkv,
8 experts top-2 beside the shared MLP, query/key layernorm after RoPE -- with
head_dim overridden to 8 (--head-dim) so that nq * head_dim != hidden_size:
the config file keeps 16), and that model's outputs on it.

    scripts/reference/.venv/bin/python scripts/reference/make_hunyuan_moe_fixture.py

Outputs: family_fixture.make_two_prompt_fixture's two-prompt fixture.
"""
from transformers import HunYuanMoEV1Config, HunYuanMoEV1ForCausalLM

from family_fixture import fail, two_prompt_main


def check_model(model, config):
    if not all(hasattr(l.mlp, "shared_mlp") for l in model.model.layers):
        fail("a layer without the shared MLP")
    return {}


if __name__ == "__main__":
    two_prompt_main(__doc__, "hunyuan_moe", "hunyuan_moe_tiny", HunYuanMoEV1Config, HunYuanMoEV1ForCausalLM,
                    "mlp.gate.wg.weight", check_model, "hunyuan_fixture_")
