#!/usr/bin/env python3
"""Writes the Hunyuan-MoE training golden fixture (tests/fixtures/hunyuan_moe_train):
AdamW steps of transformers' own HunYuanMoEV1ForCausalLM, started from the
committed tiny checkpoint (tests/fixtures/hunyuan_moe_tiny: query/key
layernorm after RoPE, a shared MLP beside 8 experts top-2, softmax router
always renormalised), in f32 on CPU.

    scripts/reference/.venv/bin/python scripts/reference/make_hunyuan_train_fixture.py \
        --out tests/fixtures/hunyuan_moe_train

The recipe is make_qwen3_train_fixture.py's (tpr's train loop, train_fixture.py), on this model:
  loss     per window: cross_entropy(model(input_ids=inputs[None]).logits[0], targets).
           HunYuanMoEV1ForCausalLM.forward adds NO router aux loss (it has no
           load_balancing_loss_func and no router_aux_loss_coef), so the
           fixture trains on the cross-entropy alone (meta: router_aux_loss_coef
           0; tpr's default for the family). The recorded "aux" is the Switch
           load-balancing loss re-derived from the router logits, for reference.
  step     mean over the windows of a step, clip_grad_norm_, AdamW(foreach=False,
           betas (0.9, 0.95), eps 1e-8, decay on ndim >= 2), warmup + cosine lr.
The router's gradient flows through the renormalised top-k probabilities
(HunYuanMoEV1Gate: softmax, topk, divided by the chosen sum) only.

Outputs (checkpoint names of hunyuan_moe_tiny/model.safetensors): tokens.npy,
step0_grads.safetensors, final_params.safetensors, meta.json (the keys
tests/train_harness.c reads).
"""
import os
import sys

from transformers import HunYuanMoEV1ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_fixture import (check_hub_mapping, fail, fused_experts_to_hub, parse_and_load,  # noqa: E402
                           run_train_fixture)

GEN = "scripts/reference/make_hunyuan_train_fixture.py"


def main():
    args, model, _ = parse_and_load(
        __doc__, HunYuanMoEV1ForCausalLM, "hunyuan_moe_train", "hunyuan_moe_tiny",
        no_aux="HunYuanMoEV1ForCausalLM trains without an aux loss; --aux-coef must stay 0",
        seed=1618, steps=6, aux_coef=0.0, warmup=2)
    config = model.config
    if hasattr(model, "router_aux_loss_coef") or "load_balancing" in open(
            sys.modules[HunYuanMoEV1ForCausalLM.__module__].__file__).read():
        fail("this transformers' HunYuanMoEV1ForCausalLM has an aux loss: the fixture's recipe is out of date")
    E, k = config.num_experts, config.moe_topk
    routers = []
    for layer in model.model.layers:  # the gate's raw logits, for the re-derived aux loss
        layer.mlp.gate.register_forward_hook(lambda m, i, o: routers.append(o[0]))

    check_hub_mapping(model, fused_experts_to_hub(dict(model.named_parameters())), args.model)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def forward_window(x):
        routers.clear()
        out = model(input_ids=x[None], use_cache=False)
        return out.logits[0], None, list(routers)

    run_train_fixture(args, model, params, fused_experts_to_hub, forward_window, E, k, GEN,
                      {"class": "transformers.HunYuanMoEV1ForCausalLM",
                       "checkpoint": "tests/fixtures/hunyuan_moe_tiny"},
                      {"per_window": "cross_entropy(logits, targets) (HunYuanMoEV1ForCausalLM has no aux loss)",
                       "aux_recorded": "Switch load-balancing loss re-derived from the gates' logits; not trained on"})


if __name__ == "__main__":
    main()
