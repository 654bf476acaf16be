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
import math
import os
import shutil
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from family_fixture import REPO, fail  # noqa: F401 (fail: the scripts' too)


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
    args.aux_coef. Returns (model, the coef the checkpoint had)."""
    torch.set_num_threads(1)  # fixed reduction order on CPU
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    model = model_cls.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager",
                                      experts_implementation="eager")
    coef_in_checkpoint = model.config.router_aux_loss_coef
    model.config.router_aux_loss_coef = args.aux_coef
    model.router_aux_loss_coef = args.aux_coef  # the CausalLM copies the coef in __init__
    model.train()
    return model, coef_in_checkpoint


def save_pretrained_tensors(model):
    tmp = tempfile.mkdtemp(prefix="train_fixture_")
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        files = sorted(os.listdir(tmp))
        if "model.safetensors" not in files:
            fail(f"save_pretrained wrote {files}, not a single model.safetensors")
        with safe_open(os.path.join(tmp, "model.safetensors"), "pt") as f:
            return {n: f.get_tensor(n) for n in f.keys()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
