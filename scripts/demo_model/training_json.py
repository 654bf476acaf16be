#!/usr/bin/env python3
"""tests/fixtures/demo_model/training.json: what the committed demo model is
and how it was trained, assembled from the run's own records (no number typed
by hand): scripts/demo_model/curve.sh's summary.json (steps, wall time, the
validation curve that tpr train scored on the f32 weights, the baselines),
the data statistics, and `tpr eval --json` of the exported bf16 model, the
value test_demo_model recomputes in CI.

Usage: training_json.py --summary build/demo_run/summary.json --eval-json EVAL.json \
           --model tests/fixtures/demo_model [--config configs/minimax_m2_demo.json]
"""
import argparse
import json
import os

from safetensors import safe_open

# train.sh's fixed hyperparameters (its environment defaults are read from the summary's run).
FIXED = {"min_lr": 3e-4, "weight_decay": 0.1, "clip": 1.0, "bias_update_rate": 1e-3}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--summary", required=True)
    ap.add_argument("--eval-json", required=True, help="tpr eval --json of the exported model on val.npy")
    ap.add_argument("--model", required=True)
    ap.add_argument("--config", default="configs/minimax_m2_demo.json")
    ap.add_argument("--run", default="", help="train.sh's settings as KEY=VALUE,... (STEPS, MB, SEQ, LR, WARMUP)")
    a = ap.parse_args()
    s = json.load(open(a.summary))
    ev = json.load(open(a.eval_json))
    cfg = json.load(open(a.config))
    with safe_open(os.path.join(a.model, "model.safetensors"), "pt") as f:
        params = sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())
    run = dict(kv.split("=") for kv in a.run.split(",") if kv)
    seq, mb = int(run.get("SEQ", 256)), int(run.get("MB", 4))
    final_f32 = s["val_curve"][-1]
    out = {
        "model": (f"{a.config}: {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
                  f"{cfg['num_attention_heads']} Q / {cfg['num_key_value_heads']} KV heads of {cfg['head_dim']} "
                  f"(rotary_dim {cfg['rotary_dim']}), QK-norm over the full projections, "
                  f"{cfg['num_local_experts']} experts of {cfg['intermediate_size']} top-{cfg['num_experts_per_tok']} "
                  f"with sigmoid routing and e_score_correction_bias, vocab {cfg['vocab_size']}; {params:,} parameters"),
        "data": s["data"],
        "training": {
            "command": "scripts/demo_model/train.sh (mpirun -np 2 tpr train --tp 1 --dp 2 --ep 2 --no-fsdp "
                       "--eval-data val.npy)",
            "seq_len": seq, "micro_batch": mb, "dp": 2,
            "lr": float(run.get("LR", 3e-3)), "warmup": int(run.get("WARMUP", 60)), **FIXED,
            "aux_coef": cfg["router_aux_loss_coef"],
            "steps": s["steps"], "tokens_seen": s["tokens_seen"],
            "epochs": round(s["tokens_seen"] / s["train_tokens"], 2),
            "wall_s": s["wall_s"], "step_ms_mean": round(s["step_ms_mean"], 1),
            "train_ce_last20": s["train_ce_last20"],
        },
        "val_curve_f32": s["val_curve"],
        "val": {
            "data": "val.npy", "seq_len": ev["seq_len"], "windows": ev["windows"], "tokens": ev["tokens"],
            "loss": ev["loss"], "loss_f32_checkpoint": final_f32["loss"],
            "computed_by": f"tpr eval --model {a.model} --data val.npy --seq-len {ev['seq_len']} (bf16 weights, one rank)",
        },
        "baselines": s["baselines"],
    }
    path = os.path.join(a.model, "training.json")
    with open(path + ".tmp", "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)
    print(f"training_json: {path}: {s['steps']} steps, val loss {ev['loss']:.6f} (f32 {final_f32['loss']:.6f})")


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


if __name__ == "__main__":
    main()
