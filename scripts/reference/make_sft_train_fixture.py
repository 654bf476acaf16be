#!/usr/bin/env python3
"""Writes the supervised fine-tuning golden fixtures (tests/fixtures/sft_train,
tests/fixtures/sft_train_qwen3): a token-shard index in the format of `tpr
data prepare` (docs/training.md) with loss masks, and what transformers'
Trainer makes of one optimizer step on it: the loss and the gradient of
transformers' own class started from a committed tiny checkpoint, in f32 on
CPU. --family qwen2_vl (the default): Qwen2VLForConditionalGeneration's text
decoder (text positions) on tests/fixtures/qwen2_vl_tiny, dense;
--family qwen3_moe: Qwen3MoeForCausalLM on tests/fixtures/qwen3_moe_tiny
(experts, router), with router_aux_loss_coef 0 and no router logits asked
for (Trainer's default: the config's output_router_logits is false, so the
model adds no aux loss).

    scripts/reference/.venv/bin/python scripts/reference/make_sft_train_fixture.py
    scripts/reference/.venv/bin/python scripts/reference/make_sft_train_fixture.py --family qwen3_moe

Data: random ids (uniform over the vocabulary) in two train shards whose
boundary falls inside a window, a val shard, and a random loss mask with a
chosen number of learned targets per window, one window with none. The step
is 4 windows of T = 16 read in order: 2 micro-batches x 2 rows (one process)
or 2 replicas x 2 micro-batches x 1 row; the target at window position t
(predicting stream token w*T + t + 1) is -100 unless mask[w*T + t + 1] = 1.

Trainer's rule, done as trainer.py does it (transformers 5.x:
get_batch_samples counts num_items_in_batch over the step's micro-batches,
compute_loss passes it to the model, whose ForCausalLMLoss sums the token
losses and divides by it; training_step then does not divide by the
accumulation steps; with average_tokens_across_devices the count is summed
over ranks and the loss multiplied by their number before DDP averages the
gradients): gradient = sum over all learned targets of d(token loss) / N.
The script runs the model with shift_labels and num_items_in_batch exactly
so (checked: the model's loss is the masked sum / N), and checks that the
two-replica arrangement gives the same gradient.

The control: the per-micro-batch mean (each micro-batch's mean over its own
learned targets, divided by the accumulation steps: what Trainer does
without num_items_in_batch) on the same 2 x 2 arrangement, recorded so the
C test can show it differs from the reference beyond the tolerance.

Outputs: data.json + data.{train.0000{0,1},val.00000}{.npy,.docs.npy,.mask.npy},
step0_grads.safetensors and control_grads.safetensors (a few tensors under
tpr's names, to keep the fixture small; the global gradient norm covers the
rest), meta.json (losses, norms, learned targets per window, the val loss of
the untrained model over the val split's windows).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from family_fixture import REPO, fail  # noqa: E402
from train_fixture import fused_experts_to_hub  # noqa: E402
from transformers import Qwen2VLForConditionalGeneration, Qwen3MoeForCausalLM  # noqa: E402

GEN = "scripts/reference/make_sft_train_fixture.py"
LM = "model.language_model."
T = 16
KEPT = [11, 0, 3, 9]  # learned targets of windows 0..3: micro-batch 0 = {0, 1}, micro-batch 1 = {2, 3}
SHARD_TOKENS = [37, 28]  # train shards: 65 = 4 windows of 16 + 1; the boundary falls inside window 2
VAL_TOKENS = 40  # 2 windows of 16 + 1, and a tail
# Per family: class, checkpoint, fixture, seed, the gradient tensors saved (tpr's names), names in memory -> tpr's.
FAMILIES = {
    "qwen2_vl": dict(cls=Qwen2VLForConditionalGeneration, model="qwen2_vl_tiny", out="sft_train", seed=3203,
                     saved=["model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.k_proj.weight",
                            "model.layers.1.self_attn.v_proj.bias", "model.layers.1.post_attention_layernorm.weight",
                            "model.norm.weight"],
                     names=lambda g: {("model." + n[len(LM):] if n.startswith(LM) else n): t for n, t in g.items()}),
    "qwen3_moe": dict(cls=Qwen3MoeForCausalLM, model="qwen3_moe_tiny", out="sft_train_qwen3", seed=3301,
                      saved=["model.layers.1.mlp.experts.3.down_proj.weight", "model.layers.2.mlp.experts.6.up_proj.weight",
                             "model.layers.1.mlp.gate.weight", "model.layers.2.self_attn.k_proj.weight",
                             "model.layers.0.self_attn.q_norm.weight", "model.norm.weight"],
                      names=fused_experts_to_hub),
}


def write_shard(out, name, tokens, mask):
    """tokens_file, docs_file (one document: [0, n]) and mask_file of one shard."""
    np.save(os.path.join(out, name + ".npy"), tokens.astype("<u2"))
    np.save(os.path.join(out, name + ".docs.npy"), np.array([0, len(tokens)], dtype="<i8"))
    np.save(os.path.join(out, name + ".mask.npy"), mask.astype("|u1"))
    return {"tokens_file": name + ".npy", "docs_file": name + ".docs.npy", "mask_file": name + ".mask.npy",
            "tokens": int(len(tokens)), "documents": 1}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=sorted(FAMILIES), default="qwen2_vl")
    ap.add_argument("--out", help="default: tests/fixtures/<the family's fixture>")
    ap.add_argument("--model", help="default: tests/fixtures/<the family's tiny checkpoint>")
    ap.add_argument("--seed", type=int, help="default: the family's")
    args = ap.parse_args()
    fam = FAMILIES[args.family]
    args.out = args.out or os.path.join(REPO, "tests", "fixtures", fam["out"])
    args.model = args.model or os.path.join(REPO, "tests", "fixtures", fam["model"])
    args.seed = fam["seed"] if args.seed is None else args.seed
    SAVED = fam["saved"]
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    gen = torch.Generator().manual_seed(args.seed)
    kw_load = {"experts_implementation": "eager"} if args.family == "qwen3_moe" else {}
    model = fam["cls"].from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager", **kw_load)
    if args.family == "qwen3_moe":
        model.config.router_aux_loss_coef = 0.0
        model.router_aux_loss_coef = 0.0
        if model.config.output_router_logits:
            fail("the checkpoint asks for router logits: Trainer would add an aux loss")
    model.train()
    V = model.config.get_text_config().vocab_size
    if getattr(model, "accepts_loss_kwargs", True) is False:
        fail("the class does not take loss kwargs: Trainer would not pass num_items_in_batch")

    n = sum(SHARD_TOKENS)
    stream = torch.randint(0, V, (n,), generator=gen)
    mask = torch.zeros(n, dtype=torch.uint8)
    mask[0] = int(torch.randint(0, 2, (1,), generator=gen))  # never a target: any value
    for w, k in enumerate(KEPT):
        pos = torch.randperm(T, generator=gen)[:k]
        mask[w * T + 1 + pos] = 1
    val = torch.randint(0, V, (VAL_TOKENS,), generator=gen)
    val_mask = torch.randint(0, 2, (VAL_TOKENS,), generator=gen, dtype=torch.uint8)

    windows = []  # (inputs, shift_labels) of windows 0..3
    for w in range(4):
        x = stream[w * T: w * T + T + 1]
        m = mask[w * T + 1: w * T + T + 1]
        y = torch.where(m == 1, x[1:], torch.full_like(x[1:], -100))
        if int((y != -100).sum()) != KEPT[w]:
            fail(f"window {w}: {int((y != -100).sum())} learned targets, want {KEPT[w]}")
        windows.append((x[:T], y))
    N = sum(KEPT)
    params = [(n_, p) for n_, p in model.named_parameters() if p.requires_grad and not n_.startswith("model.visual.")]

    def run(batches, num_items, scale):
        """Backward of every micro-batch's loss * scale; returns (sum of the losses, grads by tpr name)."""
        model.zero_grad(set_to_none=True)
        total = 0.0
        for rows in batches:
            x = torch.stack([windows[r][0] for r in rows])
            y = torch.stack([windows[r][1] for r in rows])
            kw = {"num_items_in_batch": torch.tensor(num_items)} if num_items is not None else {}
            out = model(input_ids=x, labels=x, shift_labels=y, use_cache=False, **kw)
            if getattr(out, "aux_loss", None) is not None:
                fail("the model added an aux loss")
            loss = out.loss * scale
            loss.backward()
            total += float(loss.detach())
            if num_items is not None:  # the model's loss is the masked sum / num_items
                ce = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V).double(), y.reshape(-1),
                                                       ignore_index=-100, reduction="sum")
                if abs(float(out.loss.detach()) - float(ce) / num_items) > 1e-5 * abs(float(ce) / num_items) + 1e-7:
                    fail(f"the model's loss {float(out.loss.detach())} is not the masked sum / N {float(ce) / num_items}")
        grads = fam["names"]({n_: p.grad.detach().clone() for n_, p in params})
        return total, grads

    # The reference: one process, 2 micro-batches x 2 rows, num_items_in_batch N.
    loss, grads = run([[0, 1], [2, 3]], N, 1.0)
    # Two replicas (average_tokens_across_devices): each runs its micro-batches with the global N and loss x 2;
    # DDP averages the replicas' gradients. Replica r reads windows {r, 2 + r} (tpr's row order).
    per_rank = [run([[r], [2 + r]], N, 2.0) for r in range(2)]
    for name in grads:
        g2 = 0.5 * (per_rank[0][1][name] + per_rank[1][1][name])
        d = float((g2 - grads[name]).abs().max()) / max(float(grads[name].abs().max()), 1e-30)
        if d > 1e-5:
            fail(f"two replicas give another gradient of {name}: {d:.2e}")
    loss_dp = 0.5 * (per_rank[0][0] + per_rank[1][0])
    if abs(loss_dp - loss) > 1e-6 * abs(loss):
        fail(f"two replicas report {loss_dp}, one process {loss}")
    # The control: per-micro-batch means (no num_items_in_batch), divided by the 2 accumulation steps.
    c_loss, c_grads = run([[0, 1], [2, 3]], None, 0.5)
    norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values())))
    c_norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in c_grads.values())))

    # The val split scored as tpr eval does: every token, windows of T.
    with torch.no_grad():
        model.eval()
        ces = []
        for w in range((VAL_TOKENS - 1) // T):
            x = val[w * T: w * T + T + 1]
            logits = model(input_ids=x[:T][None], use_cache=False).logits[0].double()
            ces.append(float(torch.nn.functional.cross_entropy(logits, x[1:], reduction="sum")))
        val_loss = sum(ces) / (len(ces) * T)

    out = args.out
    os.makedirs(out, exist_ok=True)
    s = np.asarray(stream)
    mk = np.asarray(mask)
    shards = [write_shard(out, "data.train.00000", s[:SHARD_TOKENS[0]], mk[:SHARD_TOKENS[0]]),
              write_shard(out, "data.train.00001", s[SHARD_TOKENS[0]:], mk[SHARD_TOKENS[0]:])]
    vshard = write_shard(out, "data.val.00000", np.asarray(val), np.asarray(val_mask))
    index = {"format": "tpr-token-shards", "version": 1, "tokenizer": "(none: random ids)", "vocab_size": V,
             "dtype": "uint16", "eos_id": None, "append_eos": False, "chat": True, "seed": args.seed,
             "val_fraction": 0.0,
             "splits": {"train": {"tokens": n, "documents": 2, "shards": shards},
                        "val": {"tokens": VAL_TOKENS, "documents": 1, "shards": [vshard]}}}
    with open(os.path.join(out, "data.json"), "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")
    md = {"generator": GEN}
    save_file({k: grads[k].contiguous() for k in SAVED}, os.path.join(out, "step0_grads.safetensors"), metadata=md)
    save_file({k: c_grads[k].contiguous() for k in SAVED}, os.path.join(out, "control_grads.safetensors"),
              metadata=md)
    import transformers
    meta = {"generator": GEN,
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
            "family": args.family,
            "model": f"tests/fixtures/{fam['model']} ({fam['cls'].__name__}; aux loss none)",
            "seq_len": T, "kept_per_window": KEPT, "num_items_in_batch": N,
            "rule": "sum of the learned token losses of the step / num_items_in_batch (Trainer, transformers 5.x)",
            "step0_loss": loss, "step0_grad_norm": norm,
            "control": {"rule": "per-micro-batch mean / grad accumulation (2 x 2)", "loss": c_loss,
                        "grad_norm": c_norm},
            "val": {"windows": (VAL_TOKENS - 1) // T, "loss": val_loss},
            "saved_grads": SAVED}
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    for fn in os.listdir(out):
        os.chmod(os.path.join(out, fn), 0o644)
    print(f"loss {loss:.6f} (control {c_loss:.6f}), |g| {norm:.6f} (control {c_norm:.6f}), val {val_loss:.6f}")
    print("all checks passed")


if __name__ == "__main__":
    main()
