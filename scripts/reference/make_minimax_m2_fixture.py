#!/usr/bin/env python3
"""Writes the MiniMax-M2 golden-test fixture (tests/fixtures/minimax_m2_tiny):
a tiny random checkpoint built with Hugging Face transformers' own
MiniMaxM2ForCausalLM, and that model's outputs on it.

    bash scripts/reference/setup_venv.sh
    scripts/reference/.venv/bin/python scripts/reference/make_minimax_m2_fixture.py \
        --out tests/fixtures/minimax_m2_tiny

Outputs (all f32 unless noted):
  config.json         what save_pretrained writes (transformers' keys), plus the
                      hub keys tpr's parser reads (rotary_dim, use_qk_norm, ...)
  model.safetensors   save_pretrained's single file, hub naming
                      (model.layers.L.block_sparse_moe.experts.E.w1.weight, ...)
  reference.safetensors
      tokens_a (i64 [Ta]), logits_a [Ta, V]; tokens_b (i64 [Tb]), logits_b
      greedy_a (i64 [G]) the next G greedy tokens after tokens_a,
      greedy_logits_a [G, V] the logits each one was chosen from
      l0_* layer-0 intermediates on tokens_a, captured with forward hooks:
        l0_attn_in [Ta, H] (self_attn input = input_layernorm out)
        l0_q_normed [Ta, nq*D], l0_k_normed [Ta, nkv*D] (q_norm / k_norm out)
        l0_q_roped [Ta, nq, D], l0_k_roped [Ta, nkv, D] (apply_rotary_pos_emb out)
        l0_attn_out [Ta, H] (self_attn incl. o_proj)
        l0_router_logits [Ta, E], l0_topk_idx (i64 [Ta, k]), l0_topk_w [Ta, k]
          (top-k sorted by descending sigmoid+bias; transformers' own order is
          torch.topk(sorted=False), i.e. unspecified)
        l0_moe_in [Ta, H] (block_sparse_moe input = post_attention_layernorm out)
        l0_moe_out [Ta, H] (block_sparse_moe out, before the residual add)
      layer_out_a [L, Ta, H] each decoder layer's output (before the final norm)
  reference.json      versions, seed, config, shapes, routing-bias statistics,
                      the partial-RoPE check, margins and self-consistency checks.

The references are computed on the model reloaded from the written
checkpoint with from_pretrained, so they belong to the bytes on disk.
"""
import argparse
import json
import math
import os
import sys

import safetensors
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import MiniMaxM2Config, MiniMaxM2ForCausalLM
from transformers.models.minimax_m2 import modeling_minimax_m2 as mm2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from family_fixture import save_checkpoint  # noqa: E402

transformers.utils.logging.disable_progress_bar()

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_CONFIG = os.path.join(REPO, "configs", "minimax_m2_tiny.json")


def fail(msg):
    print(f"make_minimax_m2_fixture: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------- weights

def randomize(model, gen, bias_scale):
    """Every parameter and persistent buffer drawn fresh from `gen`, in
    state_dict order (deterministic for a given transformers version)."""
    sd = model.state_dict()
    new = {}
    for name, t in sd.items():
        shape = tuple(t.shape)
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            v = 1.0 + 0.3 * torch.randn(shape, generator=gen)  # RMSNorm gains around 1, not ones
        elif name.endswith("e_score_correction_bias"):
            v = bias_scale * torch.randn(shape, generator=gen)
        elif name.endswith("embed_tokens.weight"):
            v = torch.randn(shape, generator=gen)
        elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            v = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])  # (E, out, in)
        elif name.endswith("mlp.gate.weight"):
            v = 1.5 * torch.randn(shape, generator=gen) / math.sqrt(shape[-1])  # router logits ~ N(0, 1.5^2)
        elif t.dim() == 2:
            v = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])  # Linear (out, in)
        else:
            fail(f"no initialisation rule for {name} {shape}")
        new[name] = v.to(t.dtype)
    missing, unexpected = model.load_state_dict(new, strict=True)
    assert not missing and not unexpected
    return sorted(sd.keys())


# ---------------------------------------------------------------- capture

class Capture:
    """Forward hooks on transformers' modules, and a wrapper around the
    module-level apply_rotary_pos_emb that MiniMaxM2Attention.forward looks up
    at call time (it still runs transformers' function, unchanged)."""

    def __init__(self, model):
        self.model = model
        self.handles = []
        self.router = []  # every router call: (layer, router_logits, hidden_in)
        self.store = {}
        self.rope_calls = []
        self._orig_rope = None
        self.record_detail = False

    def __enter__(self):
        layers = self.model.model.layers
        for li, layer in enumerate(layers):
            gate = layer.mlp.gate

            def router_hook(mod, args, out, li=li):
                self.router.append((li, out[0].detach().clone(), out[1].detach().clone(), out[2].detach().clone()))
                if self.record_detail and li == 0:
                    self.store["l0_router_logits"] = out[0].detach().clone()
                    self.store["l0_topk_w_raw"] = out[1].detach().clone()
                    self.store["l0_topk_idx_raw"] = out[2].detach().clone()

            self.handles.append(gate.register_forward_hook(router_hook))

            def layer_hook(mod, args, out, li=li):
                if self.record_detail:
                    o = out[0] if isinstance(out, tuple) else out
                    self.store[f"layer_out_{li}"] = o.detach().clone()

            self.handles.append(layer.register_forward_hook(layer_hook))

        l0 = layers[0]

        def keep(name):
            def hook(mod, args, out):
                if self.record_detail:
                    o = out[0] if isinstance(out, tuple) else out
                    self.store[name] = o.detach().clone()
            return hook

        self.handles.append(l0.self_attn.q_norm.register_forward_hook(keep("l0_q_normed")))
        self.handles.append(l0.self_attn.k_norm.register_forward_hook(keep("l0_k_normed")))
        self.handles.append(l0.self_attn.register_forward_hook(keep("l0_attn_out")))
        self.handles.append(l0.mlp.register_forward_hook(keep("l0_moe_out")))

        def attn_in(mod, args, kwargs):
            if self.record_detail:
                h = kwargs.get("hidden_states", args[0] if args else None)
                self.store["l0_attn_in"] = h.detach().clone()

        def moe_in(mod, args):
            if self.record_detail:
                self.store["l0_moe_in"] = args[0].detach().clone()

        self.handles.append(l0.self_attn.register_forward_pre_hook(attn_in, with_kwargs=True))
        self.handles.append(l0.mlp.register_forward_pre_hook(moe_in))

        self._orig_rope = mm2.apply_rotary_pos_emb
        orig = self._orig_rope

        def rope_spy(q, k, cos, sin, *a, **kw):
            q_out, k_out = orig(q, k, cos, sin, *a, **kw)
            if self.record_detail:
                self.rope_calls.append(tuple(x.detach().clone() for x in (q, k, cos, sin, q_out, k_out)))
            return q_out, k_out

        mm2.apply_rotary_pos_emb = rope_spy
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        mm2.apply_rotary_pos_emb = self._orig_rope
        return False


# ---------------------------------------------------------------- checks

def rope_check(calls, rotary_dim, head_dim, theta):
    """Partial RoPE as transformers applies it inside MiniMaxM2Attention:
    dims [rotary_dim, head_dim) untouched, dims [0, rotary_dim) rotated at
    positions > 0, and the rotation equal to NeoX rotate-half on the prefix
    with inv_freq = theta^(-2i/rotary_dim)."""
    q, k, cos, sin, q_out, k_out = calls[0]  # layer 0 of the tokens_a forward
    res = {"layer": 0, "cos_last_dim": int(cos.shape[-1])}
    T = q.shape[2]
    ok = True
    for name, x, y in (("q", q, q_out), ("k", k, k_out)):
        pass_same = torch.equal(x[..., rotary_dim:], y[..., rotary_dim:])
        pos0_same = torch.equal(x[:, :, 0, :], y[:, :, 0, :])
        rot_diff = (x[..., :rotary_dim] - y[..., :rotary_dim]).abs().amax(dim=(0, 1, 3))  # per position
        changed = bool((rot_diff[1:] > 1e-4).all())
        # independent float64 NeoX rotate-half on the first rotary_dim dims
        half = rotary_dim // 2
        inv = theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]  # (T, half)
        c, s = ang.cos(), ang.sin()
        xd = x.double()
        x1, x2 = xd[..., :half], xd[..., half:rotary_dim]
        exp = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, xd[..., rotary_dim:]], dim=-1)
        layout_err = float((exp - y.double()).abs().max())
        res[name] = {
            "pass_dims_unchanged": pass_same,
            "rot_dims_changed_at_all_positions_gt0": changed,
            "position0_unchanged": pos0_same,
            "min_rot_change_pos_gt0": float(rot_diff[1:].min()),
            "neox_rotate_half_prefix_max_abs_err": layout_err,
        }
        ok &= pass_same and changed and pos0_same and layout_err < 1e-5
    res["cos_last_dim_equals_rotary_dim"] = res["cos_last_dim"] == rotary_dim
    ok &= res["cos_last_dim_equals_rotary_dim"]
    res["ok"] = bool(ok)
    return res


def topk_sets(sig, bias, k):
    plain = torch.topk(sig, k, dim=-1).indices.sort(dim=-1).values
    biased = torch.topk(sig + bias, k, dim=-1).indices.sort(dim=-1).values
    return plain, biased


def routing_stats(model, router_calls, k):
    """Over every (token, layer) routed: how often the bias changes the chosen
    set, and the smallest gap between the k-th and (k+1)-th biased score
    (a tiny gap would let float rounding pick a different expert)."""
    changed = total = 0
    min_gap = float("inf")
    consistent = True
    for li, logits, w, idx in router_calls:
        bias = model.model.layers[li].mlp.e_score_correction_bias.detach().float()
        sig = torch.sigmoid(logits.float())
        plain, biased = topk_sets(sig, bias, k)
        changed += int((plain != biased).any(dim=-1).sum())
        total += sig.shape[0]
        sc = (sig + bias).sort(dim=-1, descending=True).values
        min_gap = min(min_gap, float((sc[:, k - 1] - sc[:, k]).min()))
        consistent &= torch.equal(idx.sort(dim=-1).values, biased)
        # weights: sigmoid of the chosen experts (no bias), renormalised
        exp_w = sig.gather(1, idx)
        exp_w = exp_w / exp_w.sum(-1, keepdim=True)
        consistent &= bool(torch.allclose(exp_w, w, atol=1e-6, rtol=0))
    return {"changed": changed, "total": total, "fraction": changed / max(total, 1), "min_topk_gap": min_gap,
            "router_matches_sigmoid_bias_topk_renorm": bool(consistent)}


def file_semantics_check(ckpt, out, config):
    """Reads the written model.safetensors by its hub names and recomputes two
    layer-0 pieces from transformers' captured inputs, to pin down what the
    names mean for a reimplementation (this is a cross-check, not the reference):
      - q_norm / k_norm: one RMSNorm over the whole projection (nq*D / nkv*D),
        not per head;
      - block_sparse_moe: top-k of sigmoid(gate x) + bias, weights = renormalised
        sigmoid of the chosen experts, expert = w2(silu(w1 x) * w3 x)."""
    eps = config.rms_norm_eps
    D = config.head_dim
    with safe_open(ckpt, "pt") as f:
        w = {n: f.get_tensor(n).double() for n in f.keys() if n.startswith("model.layers.0.")}
    p = "model.layers.0."
    x = out["l0_attn_in"].double()
    res = {}

    def rms(v, wt):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * wt

    for nm, proj in (("q", "q_proj"), ("k", "k_proj")):
        y = x @ w[p + f"self_attn.{proj}.weight"].T
        full = rms(y, w[p + f"self_attn.{nm}_norm.weight"])
        heads = rms(y.view(y.shape[0], -1, D), w[p + f"self_attn.{nm}_norm.weight"].view(-1, D)).reshape(y.shape)
        ref = out[f"l0_{nm}_normed"].double()
        res[f"{nm}_norm_full_projection_max_abs_err"] = float((full - ref).abs().max())
        res[f"{nm}_norm_per_head_would_differ_by"] = float((heads - ref).abs().max())
    h = out["l0_moe_in"].double()
    logits = h @ w[p + "block_sparse_moe.gate.weight"].T
    sig = torch.sigmoid(logits)
    idx = torch.topk(sig + w[p + "block_sparse_moe.e_score_correction_bias"], config.num_experts_per_tok,
                     dim=-1).indices
    wt = sig.gather(1, idx)
    wt = wt / wt.sum(-1, keepdim=True)
    y = torch.zeros_like(h)
    for t in range(h.shape[0]):
        for j in range(idx.shape[1]):
            e = int(idx[t, j])
            pe = p + f"block_sparse_moe.experts.{e}."
            a = torch.nn.functional.silu(h[t] @ w[pe + "w1.weight"].T) * (h[t] @ w[pe + "w3.weight"].T)
            y[t] += wt[t, j] * (a @ w[pe + "w2.weight"].T)
    res["router_logits_max_abs_err"] = float((logits - out["l0_router_logits"].double()).abs().max())
    res["topk_idx_equal"] = bool(torch.equal(idx.sort(-1).values, out["l0_topk_idx"].sort(-1).values))
    res["moe_out_w2_silu_w1_times_w3_max_abs_err"] = float((y - out["l0_moe_out"].double()).abs().max())
    res["ok"] = (res["q_norm_full_projection_max_abs_err"] < 1e-4 and res["k_norm_full_projection_max_abs_err"] < 1e-4
                 and res["router_logits_max_abs_err"] < 1e-4 and res["topk_idx_equal"]
                 and res["moe_out_w2_silu_w1_times_w3_max_abs_err"] < 1e-4)
    return res


# ---------------------------------------------------------------- main

def build_config(src, rotary_dim_override=None):
    cfg = json.load(open(src))
    cfg = dict(cfg)
    cfg.pop("torch_dtype", None)
    cfg["dtype"] = "float32"  # the weights are stored in f32
    # the hub defaults (200034/200020) lie outside a 256-token vocabulary
    cfg["bos_token_id"] = None
    cfg["eos_token_id"] = None
    cfg["pad_token_id"] = None
    return cfg


def forward_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids[None, :], use_cache=False).logits[0].float()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "minimax_m2_tiny"))
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="starting config (tpr's configs/minimax_m2_tiny.json)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--len-a", type=int, default=11)
    ap.add_argument("--len-b", type=int, default=5)
    ap.add_argument("--gen", type=int, default=8)
    ap.add_argument("--bias-scale", type=float, default=0.25,
                    help="e_score_correction_bias ~ bias_scale * N(0, 1)")
    ap.add_argument("--min-bias-fraction", type=float, default=0.30)
    args = ap.parse_args()

    torch.set_num_threads(1)  # fixed reduction order on CPU
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    # 1. the model, with transformers' own class
    cfg_dict = build_config(args.config)
    config = MiniMaxM2Config(**cfg_dict)
    config._attn_implementation = "eager"
    model = MiniMaxM2ForCausalLM(config).float().eval()
    model.set_attn_implementation("eager")
    model.set_experts_implementation("eager")
    sd_names = randomize(model, gen, args.bias_scale)

    V = config.vocab_size
    tokens_a = torch.randint(0, V, (args.len_a,), generator=gen, dtype=torch.int64)
    tokens_b = torch.randint(0, V, (args.len_b,), generator=gen, dtype=torch.int64)

    # 2. write the checkpoint with save_pretrained, then reload it
    save_checkpoint(model, args.out, "mm2_fixture_")

    ref = MiniMaxM2ForCausalLM.from_pretrained(args.out, dtype=torch.float32, attn_implementation="eager",
                                               experts_implementation="eager").eval()
    # the reloaded model holds exactly the generated weights
    rsd = ref.state_dict()
    for n, t in model.state_dict().items():
        if not torch.equal(t, rsd[n]):
            fail(f"reloaded {n} differs from the generated weight")

    with open(os.path.join(args.out, "config.json")) as f:
        emitted_cfg = json.load(f)
    with safe_open(os.path.join(args.out, "model.safetensors"), "pt") as f:
        ckpt_names = sorted(f.keys())
        ckpt_dtypes = sorted({f.get_slice(n).get_dtype() for n in ckpt_names})

    rd = int(config.rope_parameters.get("partial_rotary_factor", 1.0) * config.head_dim)
    theta = float(config.rope_parameters["rope_theta"])
    k = config.num_experts_per_tok
    L = config.num_hidden_layers
    out = {}

    with Capture(ref) as cap, torch.no_grad():
        # 3a. prompt a with all layer-0 details
        cap.record_detail = True
        logits_a = forward_logits(ref, tokens_a)
        cap.record_detail = False
        s = cap.store
        T = args.len_a
        nq, nkv, D = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        out["tokens_a"] = tokens_a
        out["logits_a"] = logits_a
        out["l0_attn_in"] = s["l0_attn_in"][0]
        out["l0_q_normed"] = s["l0_q_normed"][0]
        out["l0_k_normed"] = s["l0_k_normed"][0]
        q_in, k_in, cos, sin, q_out, k_out = cap.rope_calls[0]
        out["l0_q_roped"] = q_out[0].transpose(0, 1).contiguous()  # (nq, T, D) -> (T, nq, D)
        out["l0_k_roped"] = k_out[0].transpose(0, 1).contiguous()
        out["l0_attn_out"] = s["l0_attn_out"][0]
        out["l0_moe_in"] = s["l0_moe_in"][0]
        out["l0_router_logits"] = s["l0_router_logits"]
        # canonical order: descending sigmoid + bias (transformers uses sorted=False)
        idx_raw, w_raw = s["l0_topk_idx_raw"], s["l0_topk_w_raw"]
        bias0 = ref.model.layers[0].mlp.e_score_correction_bias.float()
        choice = torch.sigmoid(s["l0_router_logits"].float()) + bias0
        order = choice.gather(1, idx_raw).argsort(dim=-1, descending=True)
        out["l0_topk_idx"] = idx_raw.gather(1, order).to(torch.int64)
        out["l0_topk_w"] = w_raw.gather(1, order)
        out["l0_moe_out"] = s["l0_moe_out"][0]
        out["layer_out_a"] = torch.stack([s[f"layer_out_{li}"][0] for li in range(L)])
        rope = rope_check(cap.rope_calls, rd, D, theta)
        rope_calls_a = len(cap.rope_calls)

        # 3b. prompt b
        logits_b = forward_logits(ref, tokens_b)
        out["tokens_b"] = tokens_b
        out["logits_b"] = logits_b
        router_prompts = list(cap.router)

        # 3c. greedy generation with the KV cache (model.generate)
        g = ref.generate(tokens_a[None, :], max_new_tokens=args.gen, min_new_tokens=args.gen, do_sample=False,
                         num_beams=1, use_cache=True, output_logits=True, return_dict_in_generate=True,
                         eos_token_id=None, pad_token_id=0)
        greedy = g.sequences[0, args.len_a:].clone()
        greedy_logits = torch.stack([x[0].float() for x in g.logits])
        if greedy.shape[0] != args.gen:
            fail(f"generate returned {greedy.shape[0]} tokens, wanted {args.gen}")
        out["greedy_a"] = greedy.to(torch.int64)
        out["greedy_logits_a"] = greedy_logits
        router_all = list(cap.router)

    # self-consistency: uncached full forwards reproduce the cached generation
    seq = tokens_a.clone()
    nocache_logits = []
    for i in range(args.gen):
        lg = forward_logits(ref, seq)[-1]
        nocache_logits.append(lg)
        seq = torch.cat([seq, lg.argmax()[None]])
    nocache_logits = torch.stack(nocache_logits)
    if not torch.equal(seq[args.len_a:], greedy):
        fail(f"greedy with cache {greedy.tolist()} != without cache {seq[args.len_a:].tolist()}")
    cache_diff = float((nocache_logits - greedy_logits).abs().max())
    first_step_diff = float((greedy_logits[0] - logits_a[-1]).abs().max())
    top2 = greedy_logits.topk(2, dim=-1).values
    greedy_min_margin = float((top2[:, 0] - top2[:, 1]).min())

    # the default experts implementation (grouped_mm where available) agrees
    impl_default = MiniMaxM2ForCausalLM.from_pretrained(args.out, dtype=torch.float32, attn_implementation="eager").eval()
    default_impl_name = impl_default.config._experts_implementation
    default_diff = float((forward_logits(impl_default, tokens_a) - logits_a).abs().max())
    sdpa = MiniMaxM2ForCausalLM.from_pretrained(args.out, dtype=torch.float32, attn_implementation="sdpa").eval()
    sdpa_diff = float((forward_logits(sdpa, tokens_a) - logits_a).abs().max())
    # the model as generated (before the save/reload) agrees bit for bit
    gen_diff = float((forward_logits(model, tokens_a) - logits_a).abs().max())

    semantics = file_semantics_check(os.path.join(args.out, "model.safetensors"), out, config)
    stats_prompts = routing_stats(ref, router_prompts, k)
    stats_all = routing_stats(ref, router_all, k)

    # ---- verdicts
    problems = []
    if "rotary_dim" in cfg_dict and rd != cfg_dict["rotary_dim"]:
        # transformers 5.0.0-5.17.0 ignore the hub's rotary_dim (partial_rotary_factor defaults to 1)
        problems.append(f"transformers {transformers.__version__} turned rotary_dim {cfg_dict['rotary_dim']} into "
                        f"{rd} rotated dims (rope_parameters {dict(config.rope_parameters)})")
    if not rope["ok"]:
        problems.append("PARTIAL ROPE CHECK FAILED: transformers rotated dims outside [0, rotary_dim) or used a "
                        "different layout; see reference.json rope_check")
    if stats_prompts["fraction"] < args.min_bias_fraction:
        problems.append(f"e_score_correction_bias changes top-{k} for only {stats_prompts['fraction']:.1%} of "
                        f"(token, layer) on the prompts, wanted > {args.min_bias_fraction:.0%}")
    if not stats_all["router_matches_sigmoid_bias_topk_renorm"]:
        problems.append("router output is not top-k of sigmoid+bias with renormalised sigmoid weights")
    if not semantics["ok"]:
        problems.append(f"the checkpoint names do not mean what tpr assumes: {semantics}")
    if cache_diff > 1e-4:
        problems.append(f"cached vs uncached greedy logits differ by {cache_diff}")
    if gen_diff != 0.0:
        problems.append(f"reloaded checkpoint gives different logits ({gen_diff})")
    if stats_all["min_topk_gap"] < 1e-4:
        problems.append(f"a top-{k} routing decision has a gap of only {stats_all['min_topk_gap']:.2e}; "
                        "an f32 reimplementation could legitimately pick another expert (change --seed)")
    if greedy_min_margin < 1e-3:
        problems.append(f"a greedy step has a top-1/top-2 logit margin of only {greedy_min_margin:.2e} (change --seed)")

    save_file({n: t.contiguous() for n, t in out.items()}, os.path.join(args.out, "reference.safetensors"),
              # one key: safetensors writes a multi-key metadata map in no fixed order
              metadata={"generator": f"scripts/reference/make_minimax_m2_fixture.py, transformers "
                                     f"{transformers.__version__}"})

    shapes = {n: {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)} for n, t in out.items()}
    report = {
        "generator": "scripts/reference/make_minimax_m2_fixture.py",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "safetensors": safetensors.__version__, "python": sys.version.split()[0]},
        "seed": args.seed,
        "model_class": "transformers.MiniMaxM2ForCausalLM",
        "attn_implementation": "eager",
        "experts_implementation": "eager",
        "dtype": "float32",
        "config": emitted_cfg,
        "config_source": os.path.relpath(os.path.abspath(args.config), REPO),
        "init": {
            "norm weights (input/post_attention/final/q_norm/k_norm)": "1 + 0.3*N(0,1)",
            "embed_tokens": "N(0,1)",
            "Linear (q/k/v/o, lm_head), expert gate_up/down": "N(0,1)/sqrt(fan_in)",
            "router gate": "1.5*N(0,1)/sqrt(hidden)",
            "e_score_correction_bias": f"{args.bias_scale}*N(0,1)",
            "draw order": "state_dict order of transformers' module (fused experts.gate_up_proj), one torch.Generator",
            "prompts": "torch.randint(0, vocab) after the weights, same generator",
        },
        "checkpoint": {"file": "model.safetensors", "writer": "save_pretrained(safe_serialization=True)",
                       "dtypes": ckpt_dtypes, "num_tensors": len(ckpt_names), "names": ckpt_names,
                       "in_memory_state_dict_names": sd_names},
        "reference_tensors": shapes,
        "notes": {
            "l0_topk_idx": "sorted by descending sigmoid(router_logits)+bias; l0_topk_w in the same order "
                           "(transformers calls torch.topk(sorted=False))",
            "l0_q_roped/l0_k_roped": "output of transformers' apply_rotary_pos_emb in layer 0, as (T, heads, D)",
            "greedy_logits_a[i]": "logits from which greedy_a[i] was chosen; greedy_logits_a[0] ~ logits_a[-1]",
            "layer_out_a[l]": "output of decoder layer l (residual stream), before the final norm",
        },
        "routing_bias": {
            "definition": "fraction of (token, layer) whose top-k set of sigmoid(logits) differs from the top-k "
                          "set of sigmoid(logits)+e_score_correction_bias",
            "prompts_a_b": stats_prompts,
            "prompts_and_generation": stats_all,
        },
        "rope_check": {"transformers": transformers.__version__, "rotary_dim": rd, "head_dim": config.head_dim,
                       "rope_theta": theta, "apply_rotary_pos_emb_calls_on_prompt_a": rope_calls_a, **rope},
        "checkpoint_semantics_check": semantics,
        "checks": {
            "reloaded_equals_generated_logits_max_abs_diff": gen_diff,
            "greedy_cached_vs_uncached_logits_max_abs_diff": cache_diff,
            "greedy_step0_vs_logits_a_last_max_abs_diff": first_step_diff,
            "greedy_min_top1_top2_margin": greedy_min_margin,
            "default_experts_implementation": default_impl_name,
            "default_experts_impl_vs_eager_logits_max_abs_diff": default_diff,
            "sdpa_vs_eager_logits_max_abs_diff": sdpa_diff,
        },
        "problems": problems,
    }
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(report, f, indent=1, sort_keys=False)
        f.write("\n")

    # ---- summary
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, safetensors {safetensors.__version__}")
    print(f"wrote {args.out}:")
    for fn in ("config.json", "model.safetensors", "reference.safetensors", "reference.json"):
        print(f"  {fn:24s} {os.path.getsize(os.path.join(args.out, fn)):>8d} bytes")
    print(f"checkpoint: {len(ckpt_names)} tensors {ckpt_dtypes}, e.g. {ckpt_names[:3]}")
    print(f"tokens_a {tokens_a.tolist()}\ntokens_b {tokens_b.tolist()}\ngreedy_a {greedy.tolist()}")
    print(f"routing bias changes top-{k}: {stats_prompts['changed']}/{stats_prompts['total']} "
          f"= {stats_prompts['fraction']:.1%} of (token, layer) on prompts a+b; "
          f"{stats_all['fraction']:.1%} incl. generation; min top-k gap {stats_all['min_topk_gap']:.3g}")
    print(f"partial RoPE (rotary_dim {rd} of head_dim {config.head_dim}): {'OK' if rope['ok'] else 'FAILED'} "
          f"(q pass dims unchanged: {rope['q']['pass_dims_unchanged']}, k: {rope['k']['pass_dims_unchanged']}; "
          f"NeoX prefix err q {rope['q']['neox_rotate_half_prefix_max_abs_err']:.2e})")
    print(f"checkpoint semantics (q/k norm over the full projection, w2(silu(w1 x)*w3 x)): "
          f"{'OK' if semantics['ok'] else 'FAILED'}; per-head q_norm would differ by "
          f"{semantics['q_norm_per_head_would_differ_by']:.3g}")
    print(f"greedy cached vs uncached max diff {cache_diff:.2e}; min top1-top2 margin {greedy_min_margin:.3g}")
    print(f"{default_impl_name} experts vs eager: {default_diff:.2e}; sdpa vs eager: {sdpa_diff:.2e}")
    if problems:
        for p in problems:
            print("PROBLEM:", p, file=sys.stderr)
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
