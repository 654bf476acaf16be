#!/usr/bin/env python3
"""Writes the Qwen3-MoE golden-test fixture (tests/fixtures/qwen3_moe_tiny):
a tiny random checkpoint built with Hugging Face transformers' own
Qwen3MoeForCausalLM (config: configs/qwen3_moe_tiny.json -- a dense
mlp_only layer, nq != nkv, 8 experts top-2, norm_topk_prob -- with head_dim
overridden to 8 (--head-dim) so that nq * head_dim != hidden_size: the
config file keeps 16, which the config and plan tests read), and that
model's outputs on it.

    scripts/reference/.venv/bin/python scripts/reference/make_qwen3_moe_fixture.py

Outputs: family_fixture.make_two_prompt_fixture's two-prompt fixture.
"""
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from family_fixture import fail, two_prompt_main


def check_model(model, config):
    dense = [i for i in range(config.num_hidden_layers) if not hasattr(model.model.layers[i].mlp, "gate")]
    if not dense:
        fail("no dense (mlp_only) layer")
    return {"dense_layers": dense}


if __name__ == "__main__":
    two_prompt_main(__doc__, "qwen3_moe", "qwen3_moe_tiny", Qwen3MoeConfig, Qwen3MoeForCausalLM,
                    "mlp.gate.weight", check_model, "qwen3_fixture_")
