"""What the training golden-fixture scripts share (make_train_fixture.py for
MiniMax-M2, make_qwen3_train_fixture.py for Qwen3-MoE): tpr's train loop as
PyTorch runs it. The command line, the model loaded for deterministic f32
training, the hub-name mapping checked against save_pretrained, AdamW with
decay on ndim >= 2, the Zipf token stream, one optimizer step (clip, warmup +
cosine lr), the re-derived aux loss and the final report. Each script keeps
its family's hub layout, records and checks.

Everything is drawn from seeded generators in a fixed order, so a script
rerun writes the same bytes.
"""
import argparse
import json
import math
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from family_fixture import REPO, fail, grid_positions, saved_pretrained  # noqa: F401 (fail: the scripts' too)


def add_train_args(ap, fixture, model, seed, steps, aux_coef, warmup):
    """The options both scripts take; the defaults are each fixture's own."""
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", fixture))
    ap.add_argument("--model", default=os.path.join(REPO, "tests", "fixtures", model),
                    help="starting checkpoint (the committed tiny model)")
    ap.add_argument("--seed", type=int, default=seed, help="seed of the token stream")
    ap.add_argument("--zipf", type=float, default=1.1, help="token stream ~ Zipf(zipf) over a seeded permutation")
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--windows-per-step", type=int, default=2)
    ap.add_argument("--aux-coef", type=float, default=aux_coef, help="router_aux_loss_coef set in the loaded config")
    ap.add_argument("--lr-max", type=float, default=3e-3)
    ap.add_argument("--min-lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)


def load_for_training(model_cls, args):
    """Deterministic single-threaded torch; transformers' own class from
    args.model in f32, training mode, router_aux_loss_coef set to
    args.aux_coef where the config has one. Returns (model, the coef the
    checkpoint had, or None)."""
    torch.set_num_threads(1)  # fixed reduction order on CPU
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    model = model_cls.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager",
                                      experts_implementation="eager")
    # A family without an aux loss (HunYuanMoEV1) has no coef to set.
    coef_in_checkpoint = getattr(model.config, "router_aux_loss_coef", None)
    if coef_in_checkpoint is not None:
        model.config.router_aux_loss_coef = args.aux_coef
        model.router_aux_loss_coef = args.aux_coef  # the CausalLM copies the coef in __init__
    model.train()
    return model, coef_in_checkpoint


def parse_and_load(doc, model_cls, fixture, model, no_aux=None, **defaults):
    """A training fixture script's start: its command line (add_train_args
    with the fixture's defaults: seed, steps, aux_coef, warmup), then the
    model loaded for training (load_for_training) and checked to train
    deterministically (no attention dropout). no_aux: why --aux-coef must
    stay 0 (a family without an aux loss). Returns (args, model, the coef
    the checkpoint had)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add_train_args(ap, fixture, model, **defaults)
    args = ap.parse_args()
    if no_aux and args.aux_coef != 0.0:
        fail(no_aux)
    loaded, coef_in_checkpoint = load_for_training(model_cls, args)
    text = loaded.config.get_text_config()
    if text.attention_dropout != 0.0:
        fail(f"attention_dropout {text.attention_dropout}: training mode is not deterministic")
    return args, loaded, coef_in_checkpoint


def save_pretrained_tensors(model):
    with saved_pretrained(model, "train_fixture_") as tmp:
        with safe_open(os.path.join(tmp, "model.safetensors"), "pt") as f:
            return {n: f.get_tensor(n) for n in f.keys()}


def train_grid_positions(T):
    """The 3-D MRoPE positions (3, T) every window of a VL training fixture
    uses: an image-like block as get_rope_index lays out text + one image,
    4 text tokens, a 2 x 4 grid (t constant, h/w varying, offset by the start
    position), then text at max + 1. Checked to cover T tokens and to differ
    per axis (so that every axis' rotation is trained)."""
    pos3 = grid_positions(4, 2, 4, 4)
    if pos3.shape[1] != T:
        fail(f"the positions cover {pos3.shape[1]} tokens, --seq-len is {T}")
    if (pos3[1] == pos3[0]).all() or (pos3[2] == pos3[1]).all():
        fail("the 3-D positions do not differ per axis")
    return pos3


def text_positions_step0_loss(tokens, args, window_loss):
    """Step 0's loss with transformers' text positions (every axis 0..T-1),
    before any update: what tpr train without --positions-3d must give. The
    mean of window_loss(x) (x: a window's T + 1 tokens) over step 0's
    windows, without gradients."""
    T = args.seq_len
    with torch.no_grad():
        losses = [window_loss(tokens[w * T: w * T + T + 1]).item() for w in range(args.windows_per_step)]
    return sum(losses) / len(losses)


def check_hub_mapping(model, mine, model_dir):
    """The script's hub-name mapping (mine: hub name -> tensor) is transformers'
    own save_pretrained layout bit for bit, and the loaded model is the file's."""
    sp = save_pretrained_tensors(model)
    if sorted(sp) != sorted(mine):
        fail(f"hub-name mapping differs from save_pretrained: {sorted(set(sp) ^ set(mine))}")
    for n in sp:
        if not torch.equal(sp[n], mine[n]):
            fail(f"hub-name mapping of {n} differs from save_pretrained")
    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        if sorted(f.keys()) != sorted(mine):
            fail("hub names differ from the tiny checkpoint's names")
        for n in f.keys():
            if not torch.equal(f.get_tensor(n), mine[n]):
                fail(f"loaded {n} differs from the checkpoint file")


def adamw(params, args):
    """torch.optim.AdamW over params [(name, p)]: weight decay on ndim >= 2
    (transformers' in-memory layout), none on the rest. Returns (opt, the
    trained tensors in order)."""
    decay = [p for _, p in params if p.ndim >= 2]
    no_decay = [p for _, p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr_max, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    return opt, [p for _, p in params]


def zipf_tokens(V, n, args):
    """n tokens in [0, V) from a Zipf(args.zipf) unigram over a seeded
    permutation of the vocabulary. Returns (tokens int64, probs float64)."""
    gen = torch.Generator().manual_seed(args.seed)
    perm = torch.randperm(V, generator=gen)
    zipf = 1.0 / torch.arange(1, V + 1, dtype=torch.float64) ** args.zipf
    probs = torch.zeros(V, dtype=torch.float64).scatter_(0, perm, zipf / zipf.sum())
    tokens = torch.multinomial(probs, n, replacement=True, generator=gen).to(torch.int64)
    return tokens, probs


def lr_at(s, lr_max, warmup, min_lr, total):
    if s < warmup:
        return lr_max * (s + 1) / warmup
    progress = (s - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (lr_max - min_lr) * (1.0 + math.cos(math.pi * progress))


def optimizer_step(opt, trained, s, args):
    """Step s after its windows' backwards: clip_grad_norm_, the lr of step s
    on every group, AdamW. Returns (grad norm before clipping, lr)."""
    gn = float(torch.nn.utils.clip_grad_norm_(trained, args.clip))
    lr = lr_at(s, args.lr_max, args.warmup, args.min_lr, args.steps)
    for g in opt.param_groups:
        g["lr"] = lr
    opt.step()
    return gn, lr


def aux_independent(router_logits, E, k):
    """load_balancing_loss_func re-derived in float64 from the recorded router logits."""
    if not router_logits:  # a dense model (qwen2_vl): nothing routed, no aux loss
        return 0.0
    rows = torch.cat([r.double() for r in router_logits], dim=0)  # (L*T, E)
    p = torch.softmax(rows, dim=-1)
    sel = torch.topk(p, k, dim=-1).indices
    f = torch.zeros(E, dtype=torch.float64).scatter_add_(0, sel.reshape(-1), torch.ones(sel.numel(), dtype=torch.float64))
    f = f / rows.shape[0]
    P = p.sum(0) / rows.shape[0]
    return float(E * (f * P).sum())


def save_tensors(out_dir, files, generator):
    """Each {file name: {hub name: tensor}} as safetensors with one metadata
    key (a fixed byte order)."""
    md = {"generator": generator}
    for fn, tensors in files.items():
        save_file(tensors, os.path.join(out_dir, fn), metadata=md)


def finish(problems):
    """The problems on stderr and exit 1, or 'all checks passed'."""
    if problems:
        for p in problems:
            print("PROBLEM:", p, file=sys.stderr)
        sys.exit(1)
    print("all checks passed")


def fused_experts_to_hub(tensors, prefix_map=None):
    """In-memory names -> checkpoint names for the families that keep their
    experts fused in memory (experts.gate_up_proj (E, 2I, H) = cat(gate, up)
    on dim 1, experts.down_proj (E, H, I)) and save them per expert."""
    out = {}
    for n, t in tensors.items():
        t = t.detach().float().contiguous()
        if n.endswith(".mlp.experts.gate_up_proj"):
            pre, inter = n[: -len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{pre}{e}.gate_proj.weight"] = t[e, :inter].contiguous()
                out[f"{pre}{e}.up_proj.weight"] = t[e, inter:].contiguous()
        elif n.endswith(".mlp.experts.down_proj"):
            pre = n[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{pre}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[n] = t
    return out


def optimizer_meta(args, cls="torch.optim.AdamW"):
    """meta.json's "optimizer": adamw's settings and the lr schedule of args."""
    return {"class": cls, "foreach": False, "betas": [0.9, 0.95], "eps": 1e-8,
            "weight_decay": {"ndim>=2": args.weight_decay, "ndim<2": 0.0},
            "lr_schedule": {"lr_max": args.lr_max, "warmup": args.warmup, "min_lr": args.min_lr,
                            "total": args.steps},
            "grad_clip": {"max_norm": args.clip}, "steps": args.steps}


def run_train_fixture(args, model, params, to_hub, forward_window, E, k, gen, meta_model, meta_loss, extra=None):
    """tpr's train loop on `model` as PyTorch runs it, then the fixture files.

    params: [(name, p)] the trained tensors (the optimizer's, in order);
    to_hub(dict name -> tensor) -> checkpoint names; forward_window(x (T,)
    inputs) -> (logits (T, V), aux or None, router logits [(T, E)] of the MoE
    layers); the window loss is cross_entropy + args.aux_coef * aux (aux
    None: cross-entropy alone, and the recorded "aux" is the re-derived
    load-balancing loss, which the model does not train on). extra: more
    tensors for the fixture ({file: {name: tensor}}) and meta keys."""
    opt, trained = adamw(params, args)
    T, W = args.seq_len, args.windows_per_step
    n_windows = args.steps * W
    V = model.config.get_text_config().vocab_size
    tokens, _ = zipf_tokens(V, n_windows * T + 1, args)
    tokens_np = tokens.numpy().astype("<i4")

    rec = {"loss": [], "ce": [], "aux": [], "grad_norm": [], "lr": []}
    aux_checks, step0_grads, n_router = [], None, None
    for s in range(args.steps):
        opt.zero_grad(set_to_none=True)
        sums = [0.0, 0.0, 0.0]
        for j in range(W):
            w = s * W + j
            x = tokens[w * T: w * T + T + 1]
            logits, aux, router = forward_window(x[:T])
            n_router = len(router)
            ce = torch.nn.functional.cross_entropy(logits, x[1:], ignore_index=-100)
            derived = aux_independent([r.detach() for r in router], E, k)
            loss_w = ce if aux is None else ce + args.aux_coef * aux
            (loss_w / W).backward()
            aux_v = derived if aux is None else aux.item()
            for i, v in enumerate((loss_w.item(), ce.item(), aux_v)):
                sums[i] += v
            if aux is not None:
                aux_checks.append(abs(derived - aux.item()))
        if s == 0:
            step0_grads = {n: p.grad.detach().clone() for n, p in params}
        gn, lr = optimizer_step(opt, trained, s, args)
        for key, v in zip(("loss", "ce", "aux"), sums):
            rec[key].append(v / W)
        rec["grad_norm"].append(gn)
        rec["lr"].append(lr)
        print(f"step {s}: loss {sums[0] / W:.6f} ce {sums[1] / W:.6f} aux {sums[2] / W:.6f} grad_norm {gn:.4f} lr {lr:.4g}")

    problems = []
    if aux_checks and max(aux_checks) > 1e-5:
        problems.append(f"out.aux_loss differs from the re-derived loss by {max(aux_checks)}")
    grads_hub = to_hub(step0_grads)
    if any(not bool((g != 0).any()) for n, g in grads_hub.items() if n.endswith("norm.weight") or "gate" in n):
        problems.append("a norm weight or router got no step-0 gradient")
    if not any(g > args.clip for g in rec["grad_norm"]):
        problems.append("clipping never active")

    os.makedirs(args.out, exist_ok=True)
    import numpy as np
    import transformers
    np.save(os.path.join(args.out, "tokens.npy"), tokens_np)
    files = {"step0_grads.safetensors": grads_hub, "final_params.safetensors": to_hub(dict(params))}
    files.update((extra or {}).get("files", {}))
    save_tensors(args.out, files, f"{gen}, transformers {transformers.__version__}")
    meta = {
        "generator": gen,
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "model": dict(meta_model, router_aux_loss_coef=args.aux_coef, moe_layers_routed=n_router),
        "data": {"file": "tokens.npy", "seed": args.seed, "seq_len": T, "windows_per_step": W,
                 "window": "window w = tokens[w*T : w*T+T+1]; inputs = first T, targets = last T"},
        "loss": meta_loss,
        "optimizer": optimizer_meta(args),
        "records": rec,
        "checks": {"aux_loss_vs_rederived_float64_max_abs_diff": max(aux_checks) if aux_checks else None},
        "problems": problems,
    }
    meta.update((extra or {}).get("meta", {}))
    write_meta(args.out, meta, problems)


def write_meta(out_dir, meta, problems):
    """meta.json into out_dir, then finish(problems)."""
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"wrote {out_dir}")
    finish(problems)


def run_vl_train_fixture(args, model, params, to_hub, forward_window, E, k, gen, meta_model, meta_loss, pos3,
                         text_loss0):
    """run_train_fixture for a VL family trained on the 3-D positions pos3
    (3, T): positions_3d.npy written beside the fixture, and meta keys
    text_positions_step0_loss and positions_3d."""
    os.makedirs(args.out, exist_ok=True)
    import numpy as np
    np.save(os.path.join(args.out, "positions_3d.npy"), pos3.numpy().astype("<i4"))
    run_train_fixture(args, model, params, to_hub, forward_window, E, k, gen, meta_model, meta_loss,
                      {"meta": {"text_positions_step0_loss": text_loss0, "positions_3d": pos3.tolist()}})
