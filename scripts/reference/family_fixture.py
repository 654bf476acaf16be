"""What the golden-fixture scripts of the per-head-QK-norm families share
(make_qwen3_moe_fixture.py, make_hunyuan_moe_fixture.py,
make_qwen3_vl_moe_fixture.py): seeding, the parameter initialisation, the
save/reload check, the two-prompt reference (tokens_a/b, their logits, the
greedy continuation of a) and the final report. Each script keeps what is its
family's own (classes, router name, layout conversion, extra checks).

Everything is drawn from one torch.Generator in a fixed order, so a script
rerun writes the same bytes.
"""
import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import tempfile

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

transformers.utils.logging.disable_progress_bar()
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fail(msg):
    name = os.path.splitext(os.path.basename(sys.argv[0]))[0]
    print(f"{name}: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def seeded(seed):
    """Deterministic single-threaded torch; the generator every draw comes from."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def randomize(model, gen, router, visual_scale=None):
    """Every parameter drawn fresh from `gen`, in state_dict order. `router`:
    the suffix of the router weight (None: no router); visual_scale: the scale
    of a vision tower's weights (never run; drawn so the file is deterministic)."""
    new = {}
    for name, t in model.state_dict().items():
        shape = tuple(t.shape)
        if visual_scale is not None and "visual" in name:
            v = visual_scale * torch.randn(shape, generator=gen)
        elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            v = 1.0 + 0.3 * torch.randn(shape, generator=gen)  # RMSNorm gains around 1, not ones
        elif name.endswith("embed_tokens.weight"):
            v = torch.randn(shape, generator=gen)
        elif name.endswith(".bias") and t.dim() == 1:
            v = 0.5 * torch.randn(shape, generator=gen)  # q/k/v biases (Qwen2-VL): non-zero, so leaving one out shows
        elif router and name.endswith(router):
            v = 1.5 * torch.randn(shape, generator=gen) / math.sqrt(shape[-1])  # router logits ~ N(0, 1.5^2)
        elif t.dim() in (2, 3):
            v = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])  # Linear / fused experts (.., out, in)
        else:
            fail(f"no initialisation rule for {name} {shape}")
        new[name] = v.to(t.dtype)
    model.load_state_dict(new, strict=True)


@contextlib.contextmanager
def saved_pretrained(model, tmp_prefix):
    """model.save_pretrained into a temporary directory, which must hold a
    single model.safetensors; yields the directory, removed afterwards."""
    tmp = tempfile.mkdtemp(prefix=tmp_prefix)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        files = sorted(os.listdir(tmp))
        if "model.safetensors" not in files:
            fail(f"save_pretrained wrote {files}, not a single model.safetensors")
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def copy_saved(saved_dir, out_dir):
    """save_pretrained's config.json and model.safetensors, into out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    for f in ("config.json", "model.safetensors"):
        shutil.copyfile(os.path.join(saved_dir, f), os.path.join(out_dir, f))


def save_checkpoint(model, out_dir, tmp_prefix):
    """What save_pretrained writes, into out_dir."""
    with saved_pretrained(model, tmp_prefix) as tmp:
        copy_saved(tmp, out_dir)


def check_reloaded(model, ref):
    """The reloaded model holds exactly the generated weights."""
    rsd, msd = ref.state_dict(), model.state_dict()
    for n, t in msd.items():
        if not torch.equal(rsd[n], t):
            fail(f"reloaded {n} differs from the generated weight")
    return rsd


def write_reference(out_dir, out):
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(out_dir, "reference.safetensors"))


def tensor_names(out_dir):
    with safe_open(os.path.join(out_dir, "model.safetensors"), "pt") as f:
        return sorted(f.keys())


def fixture_bytes(out_dir):
    return sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))


def check_size(size):
    if size > 1 << 20:
        fail(f"the fixture takes {size} bytes, over 1 MB")


def forward_logits(model, tokens):
    with torch.no_grad():
        return model(tokens[None, :], use_cache=False).logits[0].float()


def grid_positions(n_text_a, grid_h, grid_w, n_text_b):
    """(3, T) MRoPE positions as get_rope_index lays out text + one image:
    n_text_a text tokens, a grid_h x grid_w image grid (t constant, h/w
    offset by its start), then n_text_b text tokens from max + 1."""
    rows = [[], [], []]
    for i in range(n_text_a):
        for a in range(3):
            rows[a].append(i)
    start = n_text_a
    for h in range(grid_h):
        for w in range(grid_w):
            rows[0].append(start)
            rows[1].append(start + h)
            rows[2].append(start + w)
    nxt = max(max(r) for r in rows) + 1
    for i in range(n_text_b):
        for a in range(3):
            rows[a].append(nxt + i)
    return torch.tensor(rows, dtype=torch.int64)


def vl_lm_logits(model, tokens, pos3):
    """A VL model's language model alone on tokens at 3-D positions pos3 (3, T): the logits (T, V)."""
    with torch.no_grad():
        out = model.model.language_model(input_ids=tokens[None, :], position_ids=pos3[:, None, :], use_cache=False)
        return model.lm_head(out.last_hidden_state)[0].float()


def vl_greedy_references(ref, tokens, pos3, gen, text_tokens, text_gen, out):
    """A VL fixture's decoding references into out: greedy continuations of
    tokens at 3-D positions pos3, continuing at max + 1 on every axis
    (rope_deltas: "greedy", "greedy_logits"), and transformers' own generate
    on a text prompt ("text_tokens", "text_greedy", "text_greedy_logits")."""
    seq, p3, glog, greedy = tokens.clone(), pos3.clone(), [], []
    nxt = int(pos3.max()) + 1
    for j in range(gen):
        lg = vl_lm_logits(ref, seq, p3)[-1]
        tok = int(lg.argmax())
        glog.append(lg)
        greedy.append(tok)
        seq = torch.cat([seq, torch.tensor([tok])])
        p3 = torch.cat([p3, torch.full((3, 1), nxt + j, dtype=torch.int64)], dim=1)
    out["greedy"] = torch.tensor(greedy, dtype=torch.int64)
    out["greedy_logits"] = torch.stack(glog)
    with torch.no_grad():
        g = ref.generate(text_tokens[None, :], max_new_tokens=text_gen, min_new_tokens=text_gen,
                         do_sample=False, num_beams=1, use_cache=True, output_logits=True,
                         return_dict_in_generate=True)
    out["text_tokens"] = text_tokens
    out["text_greedy"] = g.sequences[0, text_tokens.shape[0]:].clone().to(torch.int64)
    out["text_greedy_logits"] = torch.stack([x[0].float() for x in g.logits])
    if out["text_greedy"].shape[0] != text_gen:
        fail("generate returned the wrong number of tokens")


def two_prompt_args(doc, family, config_name):
    """The command line of a two-prompt fixture: tests/fixtures/<family>_tiny
    from configs/<config_name>.json."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", f"{family}_tiny"))
    ap.add_argument("--config", default=os.path.join(REPO, "configs", f"{config_name}.json"))
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--len-a", type=int, default=11)
    ap.add_argument("--len-b", type=int, default=5)
    ap.add_argument("--gen", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=8, help="overrides the config's head_dim (0: keep it)")
    return ap.parse_args()


def make_two_prompt_fixture(args, config_cls, model_cls, router, check_model, tmp_prefix):
    """Builds model_cls from args.config (head_dim overridden to args.head_dim,
    which must then differ from hidden_size / heads), randomises it, checks it
    (check_model(model, config) -> report entries) and writes to args.out:
      config.json         what save_pretrained writes (transformers' keys)
      model.safetensors   save_pretrained's single file, per-expert hub naming
      reference.safetensors
          tokens_a (i64 [Ta]), logits_a [Ta, V] f32; tokens_b (i64 [Tb]), logits_b;
          greedy_a (i64 [G]) the next G greedy tokens after tokens_a (generate,
          KV cache), greedy_logits_a [G, V] the logits each one was chosen from.
    The references come from the model reloaded with from_pretrained, so they
    belong to the bytes on disk."""
    gen = seeded(args.seed)
    with open(args.config) as f:
        cfg = {k: v for k, v in json.load(f).items() if k not in ("architectures", "model_type", "torch_dtype")}
    if args.head_dim:
        cfg["head_dim"] = args.head_dim
    config = config_cls(**cfg)
    if config.head_dim * config.num_attention_heads == config.hidden_size:
        fail("the config's head_dim equals hidden_size / num_attention_heads; the fixture wants them apart")
    model = model_cls(config).float().eval()
    model.set_attn_implementation("eager")
    model.set_experts_implementation("eager")
    randomize(model, gen, router)
    extra = check_model(model, config)

    V = config.vocab_size
    tokens_a = torch.randint(0, V, (args.len_a,), generator=gen, dtype=torch.int64)
    tokens_b = torch.randint(0, V, (args.len_b,), generator=gen, dtype=torch.int64)

    save_checkpoint(model, args.out, tmp_prefix)

    ref = model_cls.from_pretrained(args.out, dtype=torch.float32, attn_implementation="eager",
                                    experts_implementation="eager").eval()
    check_reloaded(model, ref)
    names = tensor_names(args.out)
    out = {"tokens_a": tokens_a, "tokens_b": tokens_b}
    out["logits_a"] = forward_logits(ref, tokens_a)
    out["logits_b"] = forward_logits(ref, tokens_b)
    with torch.no_grad():
        g = ref.generate(tokens_a[None, :], max_new_tokens=args.gen, min_new_tokens=args.gen, do_sample=False,
                         num_beams=1, use_cache=True, output_logits=True, return_dict_in_generate=True)
    greedy = g.sequences[0, args.len_a:].clone()
    if greedy.shape[0] != args.gen:
        fail(f"generate returned {greedy.shape[0]} tokens, wanted {args.gen}")
    out["greedy_a"] = greedy.to(torch.int64)
    out["greedy_logits_a"] = torch.stack([x[0].float() for x in g.logits])
    top2 = out["greedy_logits_a"].topk(2, dim=-1).values
    write_reference(args.out, out)
    size = fixture_bytes(args.out)
    print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__, "seed": args.seed,
                      **extra, "tensors": len(names), "first_tensors": names[:6],
                      "greedy_a": greedy.tolist(), "greedy_min_margin": float((top2[:, 0] - top2[:, 1]).min()),
                      "bytes": size}, indent=1))
    check_size(size)


def two_prompt_main(doc, family, config_name, config_cls, model_cls, router, check_model, tmp_prefix):
    """A two-prompt fixture script's whole run: its command line
    (two_prompt_args), then make_two_prompt_fixture."""
    args = two_prompt_args(doc, family, config_name)
    make_two_prompt_fixture(args, config_cls, model_cls, router, check_model, tmp_prefix)


def vl_fixture_args(doc, family, seed):
    """The command line of a VL fixture (tests/fixtures/<family>_tiny): a
    grid prompt and a text prompt, each with greedy tokens to generate."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", f"{family}_tiny"))
    ap.add_argument("--seed", type=int, default=seed)
    ap.add_argument("--gen", type=int, default=4)
    ap.add_argument("--text-len", type=int, default=7)
    ap.add_argument("--text-gen", type=int, default=6)
    return ap.parse_args()


def vl_prompts(gen, vocab_size, text_len):
    """A VL fixture's prompts, drawn from gen in this order: the grid prompt's
    3-D positions (3, T) (3 text tokens, a 2 x 3 grid, 3 text tokens) and
    tokens (T), then the text prompt's tokens (text_len)."""
    pos3 = grid_positions(3, 2, 3, 3)
    tokens = torch.randint(0, vocab_size, (pos3.shape[1],), generator=gen, dtype=torch.int64)
    text_tokens = torch.randint(0, vocab_size, (text_len,), generator=gen, dtype=torch.int64)
    return pos3, tokens, text_tokens


def save_and_reload(model, model_cls, out_dir, tmp_prefix):
    """save_checkpoint, and the model reloaded (f32, eager attention) from
    what save_pretrained wrote, checked to hold the same weights. Returns
    (the reloaded model, check_reloaded's state dict)."""
    with saved_pretrained(model, tmp_prefix) as tmp:
        copy_saved(tmp, out_dir)
        ref = model_cls.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager").eval()
    return ref, check_reloaded(model, ref)
