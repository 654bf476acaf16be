#!/usr/bin/env python3
"""Writes the MiniMax training golden fixture (tests/fixtures/minimax_train):
AdamW steps of transformers' own MiniMaxForCausalLM, started from the
committed tiny hybrid checkpoint (tests/fixtures/minimax_tiny: lightning
attention layers 0, 2, 3 and a softmax layer 1, block_size 4, residual
factors != 1, 4 experts top-2), in f32 on CPU.

    scripts/reference/.venv/bin/python scripts/reference/make_minimax_train_fixture.py

The recipe is train_fixture.py's (tpr's train loop): per window of 16 tokens
(4 lightning blocks) out = model(input_ids, output_router_logits=True), loss =
cross_entropy + coef * out.aux_loss (load_balancing_loss_func over every
layer's router logits, re-derived as a check), the mean over the step's
windows, clip_grad_norm_, AdamW. The gradients flow through the lightning
layers' block loop (transformers' own), their full-hidden norm and sigmoid
gate; the decay buffers are constants.

Outputs (checkpoint names of minimax_tiny/model.safetensors:
model.layers.L.block_sparse_moe.experts.E.w1.weight, ...): tokens.npy,
step0_grads.safetensors, final_params.safetensors, meta.json (the keys
tests/train_harness.c reads).
"""
import os
import sys

from transformers import MiniMaxForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_fixture import check_hub_mapping, parse_and_load, run_train_fixture  # noqa: E402

GEN = "scripts/reference/make_minimax_train_fixture.py"


def to_hub(tensors):
    """In-memory names -> the checkpoint's (mixtral layout): mlp.gate ->
    block_sparse_moe.gate, the fused experts -> experts.E.w1 / w3 / w2."""
    out = {}
    for n, t in tensors.items():
        t = t.detach().float().contiguous()
        n = n.replace(".mlp.gate.", ".block_sparse_moe.gate.")
        if n.endswith(".mlp.experts.gate_up_proj"):
            pre, inter = n[: -len("mlp.experts.gate_up_proj")] + "block_sparse_moe.experts.", t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{pre}{e}.w1.weight"] = t[e, :inter].contiguous()
                out[f"{pre}{e}.w3.weight"] = t[e, inter:].contiguous()
        elif n.endswith(".mlp.experts.down_proj"):
            pre = n[: -len("mlp.experts.down_proj")] + "block_sparse_moe.experts."
            for e in range(t.shape[0]):
                out[f"{pre}{e}.w2.weight"] = t[e].contiguous()
        else:
            out[n] = t
    return out


def main():
    args, model, _ = parse_and_load(__doc__, MiniMaxForCausalLM, "minimax_train", "minimax_tiny",
                                    seed=3141, steps=6, aux_coef=0.05, warmup=2)
    config = model.config
    E, k = config.num_local_experts, config.num_experts_per_tok
    routers = []
    for layer in model.model.layers:  # the router's raw logits, for the re-derived aux loss
        layer.mlp.gate.register_forward_hook(lambda m, i, o: routers.append(o[0]))
    # The checkpoint also holds the lightning layers' persistent decay buffers (constants, never trained).
    check_hub_mapping(model, to_hub({**dict(model.named_parameters()), **{n: b for n, b in model.named_buffers() if "rotary_emb" not in n}}), args.model)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def forward_window(x):
        routers.clear()
        out = model(input_ids=x[None], output_router_logits=True, use_cache=False)
        return out.logits[0], out.aux_loss, list(routers)

    run_train_fixture(args, model, params, to_hub, forward_window, E, k, GEN,
                      {"class": "transformers.MiniMaxForCausalLM", "checkpoint": "tests/fixtures/minimax_tiny",
                       "layer_types": list(config.layer_types), "block_size": config.block_size},
                      {"per_window": "cross_entropy(logits, targets) + router_aux_loss_coef * out.aux_loss",
                       "aux_function": "transformers.models.minimax.modeling_minimax.load_balancing_loss_func "
                                       "(every layer's router logits)"})


if __name__ == "__main__":
    main()
