#!/usr/bin/env python3
"""PyTorch eager training-throughput baseline for tpr's train loop: transformers'
MiniMaxM2ForCausalLM built from a tpr config, random init, f32 on CPU, one
full step = forward + CE + aux loss, backward, grad clipping, AdamW step.

    scripts/reference/.venv/bin/python scripts/bench/train_torch.py \
        --config configs/minimax_m2_small.json [--threads 2] [--seq-len 256] \
        [--micro-batch 1] [--warmup 2] [--steps 5] [--json]

The tpr config -> transformers config conversion is make_minimax_m2_fixture's
build_config (imported, so both read a config the same way). The loss is the
one in scripts/reference/make_train_fixture.py: cross_entropy + aux_coef *
out.aux_loss. Prints a table, or with --json one JSON object.
"""
import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "scripts", "reference"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from transformers import MiniMaxM2Config, MiniMaxM2ForCausalLM  # noqa: E402

from make_minimax_m2_fixture import build_config  # noqa: E402


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # ru_maxrss is KiB on Linux


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="tpr model config (HF-style JSON), e.g. configs/minimax_m2_small.json")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--aux-coef", type=float, default=0.02)
    ap.add_argument("--attn", default="sdpa", choices=["eager", "sdpa"], help="attn_implementation")
    ap.add_argument("--experts", default=None,
                    help="experts_implementation (default: transformers' default for this device)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args()
    assert args.threads >= 1 and args.seq_len >= 1 and args.micro_batch >= 1 and args.steps >= 1
    assert args.warmup >= 0

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    transformers.utils.logging.set_verbosity_error()

    cfg = build_config(args.config)
    config = MiniMaxM2Config(**cfg)
    config.router_aux_loss_coef = args.aux_coef
    t0 = time.perf_counter()
    model = MiniMaxM2ForCausalLM(config).float()  # post_init: transformers' random init
    model.set_attn_implementation(args.attn)
    if args.experts:
        model.set_experts_implementation(args.experts)
    model.train()
    build_s = time.perf_counter() - t0
    experts_impl = getattr(model.config, "_experts_implementation", None)

    params = [p for p in model.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    opt = torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": args.weight_decay},
                             {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    V, B, T = config.vocab_size, args.micro_batch, args.seq_len
    gen = torch.Generator().manual_seed(args.seed + 1)
    n_total = args.warmup + args.steps
    data = torch.randint(0, V, (n_total, B, T + 1), generator=gen, dtype=torch.int64)

    times, losses = [], []
    phases = {"forward": [], "backward": [], "clip_and_adamw": []}
    for s in range(n_total):
        x, y = data[s, :, :T], data[s, :, 1:]
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = model(input_ids=x, output_router_logits=True, use_cache=False)
        ce = F.cross_entropy(out.logits.reshape(-1, V), y.reshape(-1))
        loss = ce + args.aux_coef * out.aux_loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, args.clip)
        opt.step()
        t3 = time.perf_counter()
        losses.append(loss.item())
        if s >= args.warmup:
            times.append(t3 - t)
            phases["forward"].append(t1 - t)
            phases["backward"].append(t2 - t1)
            phases["clip_and_adamw"].append(t3 - t2)
        assert torch.isfinite(torch.tensor(losses[-1])), f"non-finite loss at step {s}"

    mean_s = statistics.mean(times)
    med_s = statistics.median(times)
    tokens_per_step = B * T
    res = {
        "bench": "train_torch",
        "config": os.path.relpath(os.path.abspath(args.config), REPO),
        "model": {"class": "transformers.MiniMaxM2ForCausalLM", "params": n_params,
                  "layers": config.num_hidden_layers, "hidden": config.hidden_size,
                  "experts": config.num_local_experts, "top_k": config.num_experts_per_tok,
                  "vocab": V, "attn_implementation": args.attn, "experts_implementation": experts_impl,
                  "dtype": "float32", "init": "transformers post_init (random)"},
        "threads": args.threads, "seq_len": T, "micro_batch": B, "tokens_per_step": tokens_per_step,
        "warmup_steps": args.warmup, "timed_steps": args.steps,
        "step": "forward + CE + aux_coef*aux_loss, backward, clip_grad_norm_, AdamW step (torch defaults)",
        "ms_per_step_mean": mean_s * 1e3, "ms_per_step_median": med_s * 1e3,
        "ms_per_step_min": min(times) * 1e3, "ms_per_step_max": max(times) * 1e3,
        "tokens_per_s": tokens_per_step / mean_s,
        "phase_ms_mean": {k: statistics.mean(v) * 1e3 for k, v in phases.items()},
        "peak_rss_mib": peak_rss_mib(),
        "build_s": build_s,
        "losses": losses,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "host": {"cpu": platform.processor() or platform.machine(), "os_cpus": os.cpu_count()},
    }
    if args.json:
        print(json.dumps(res))
        return
    print(f"train_torch: {res['config']}  {n_params / 1e6:.1f}M params, f32, attn {args.attn}, "
          f"experts {experts_impl}, torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"{'threads':>7} {'seq':>5} {'mbs':>4} {'steps':>5} {'tokens/s':>10} {'ms/step':>10} "
          f"{'(median)':>10} {'peak RSS MiB':>13}")
    print(f"{args.threads:>7} {T:>5} {B:>4} {args.steps:>5} {res['tokens_per_s']:>10.1f} "
          f"{res['ms_per_step_mean']:>10.1f} {res['ms_per_step_median']:>10.1f} {res['peak_rss_mib']:>13.0f}")
    print("phases (ms, mean): " + ", ".join(f"{k} {v:.1f}" for k, v in res["phase_ms_mean"].items()))
    print("losses:", " ".join(f"{v:.4f}" for v in losses))


if __name__ == "__main__":
    main()
