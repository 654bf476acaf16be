#!/usr/bin/env python3
"""A plain-PyTorch reference of MiniCPM-SALA (openbmb/MiniCPM-SALA), written
from the published sources listed in docs/minicpm-sala.md (the model's own
modeling_minicpm_sala.py and config.json, and the infllm_v2 kernels it calls);
no transformers class exists for it. Everything runs in float64 on the CPU, so
it is the ground truth tpr's ops and the minicpm_sala family are checked
against.

    scripts/reference/.venv/bin/python scripts/reference/minicpm_sala_ref.py \
        [--variant a|b] [--out-dir tests/fixtures/minicpm_sala_tiny[_b]] [--seed 35]

writes a tiny random checkpoint (config.json with the published key names,
model.safetensors with the published tensor names, bf16) and reference.safetensors:
the logits of a prompt longer than sparse_config.dense_len (so its sparse layers
run InfLLM-v2 sparse attention) and of one shorter (dense), the long prompt
with the sparse layers forced dense, the greedy continuation of the long
prompt through the cache (prefill in one call, then one token per call, as
the published model's generate does), and the same prompt prefilled in two
calls ("chunks": the first ends below dense_len, so it runs dense) with its
logits and greedy continuation. --variant b writes a second checkpoint
(tiny_config_b: other sizes, the optional pieces off) to minicpm_sala_tiny_b.

The pieces, each as docs/minicpm-sala.md states it:
  - muP: embeddings * scale_emb; each residual branch * scale_depth /
    sqrt(num_hidden_layers); the lm head reads h / (hidden_size / dim_model_base);
  - lightning layers (mixer "lightning-attn"): q/k/v projections, per-head
    RMSNorm of q and k (qk_norm), RoPE (lightning_use_rope), k/v repeated to
    the query heads, simple gated linear attention with the ALiBi slope of each
    head as decay (S_t = exp(-slope_h) S_{t-1} + k_t^T v_t, o_t = scale q_t S_t),
    RMSNorm over all heads' outputs together (use_output_norm), a sigmoid gate
    from z_proj (use_output_gate), o_proj;
  - sparse layers (mixer "minicpm4"): q/k/v projections, no position encoding
    (attn_use_rope false), InfLLM-v2 attention (sparse_attention below), a
    sigmoid gate from o_gate (attn_use_output_gate), o_proj;
  - a dense SwiGLU MLP; RMSNorm before each branch and at the end.
"""
import argparse
import json
import math
import os

import torch

LIGHTNING = ("lightning", "lightning_attn", "lightning-attn")  # the mixer names the published code accepts
SPARSE = "minicpm4"


# ---------------------------------------------------------------- small pieces


def rms_norm(x, w, eps):
    """MiniCPMRMSNorm: x / sqrt(mean(x^2) + eps) * w over the last dim."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):
    """NeoX rotate-half RoPE over the whole head: x (T, H, D), pos (T)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = pos.to(torch.float64)[:, None] * inv[None, :]  # (T, D/2)
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None, :], torch.cat([ang.sin()] * 2, -1)[:, None, :]
    rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rot * sin


def alibi_slopes(n):
    """_build_slope_tensor: ALiBi's geometric slopes for n heads (the closest
    power of two, then every other slope of twice that many)."""
    def pow2(m):
        start = 2 ** (-(2 ** -(math.log2(m) - 3)))
        return [start * start ** i for i in range(m)]
    if math.log2(n).is_integer():
        return pow2(n)
    c = 2 ** math.floor(math.log2(n))
    return pow2(c) + alibi_slopes(2 * c)[0::2][: n - c]


# ---------------------------------------------------------------- InfLLM-v2


class Sparse:
    """sparse_config, with the published defaults (InfLLMv2Attention.__init__)."""

    def __init__(self, sc):
        self.kernel_size = int(sc.get("kernel_size", 32))
        self.kernel_stride = int(sc.get("kernel_stride", 16))
        self.init_blocks = int(sc.get("init_blocks", 1))
        self.block_size = int(sc.get("block_size", 64))
        self.window_size = int(sc.get("window_size", 2048))
        self.dense_len = int(sc.get("dense_len", 8192))
        self.topk = int(sc.get("topk", 64))
        if sc.get("use_nope", False):
            raise ValueError("sparse_config.use_nope = true is not implemented (the published config has false)")
        ks, s, bs = self.kernel_size, self.kernel_stride, self.block_size
        if ks < 1 or s < 1 or ks % s or bs % s:
            raise ValueError(f"kernel_size {ks} and block_size {bs} must be multiples of kernel_stride {s}")
        self.local_blocks = self.window_size // bs


def compressed_keys(k, ks, s):
    """CompressK: the mean of every kernel_size keys, starting every stride
    tokens, over chunks that fit the sequence. k (L, Hkv, D) -> (n, Hkv, D)."""
    L = k.shape[0]
    n = (L - ks) // s + 1 if L >= ks else 0
    if n == 0:
        return k.new_zeros((0,) + tuple(k.shape[1:]))
    return torch.stack([k[j * s: j * s + ks].mean(0) for j in range(n)])


def select_blocks(q_g, c, p, sp, scale, force_dense=False):
    """The key blocks query position p of one KV group attends (sorted list).

    q_g (G, D): the group's query heads at p; c (n, D): the group's compressed
    keys. Blocks are sp.block_size positions; qb = p // block_size is the
    query's block. init blocks (b < init_blocks) and local blocks
    (qb - local_blocks < b <= qb) are always attended; of the other past blocks
    the topk - init_blocks best by score are added, ties to the lower index.
    Score of block b: the max over the compressed chunks j overlapping it that
    end at or before p (j*stride + kernel_size <= p + 1) of
    sum over the group's heads of softmax_j(q_h . c_j * scale) (softmax over
    those same chunks); 0 when there is none."""
    bs, s, ks = sp.block_size, sp.kernel_stride, sp.kernel_size
    qb = p // bs
    if force_dense:
        return list(range(qb + 1))
    keep = {b for b in range(qb + 1) if b < sp.init_blocks or b > qb - sp.local_blocks}
    cand = [b for b in range(qb + 1) if b not in keep]
    n_valid = min(c.shape[0], (p + 1 - ks) // s + 1 if p + 1 >= ks else 0)
    score = torch.zeros(c.shape[0], dtype=torch.float64)
    if n_valid > 0:
        logits = (q_g @ c[:n_valid].T) * scale  # (G, n_valid)
        score[:n_valid] = torch.softmax(logits, -1).sum(0)
    per_block = []
    for b in cand:
        lo, hi = max(0, b * bs // s - (ks // s - 1)), min(n_valid, (b + 1) * bs // s)
        per_block.append(float(score[lo:hi].max()) if hi > lo else 0.0)
    slots = max(0, sp.topk - sp.init_blocks)
    order = sorted(range(len(cand)), key=lambda i: (-per_block[i], cand[i]))  # ties: lower block first
    keep.update(cand[i] for i in order[:slots])
    return sorted(keep)


def sparse_attention(q, k, v, p0, sp, scale, force_dense=False, select=select_blocks):
    """InfLLM-v2 attention of one sequence's call. q (T, Hq, D) at positions
    p0 .. p0+T-1; k, v (L, Hkv, D) the sequence's keys and values with
    L = p0 + T (the cache then this call's rows). Below dense_len (L <
    sp.dense_len, decided once per call as the published forward does) every
    block is attended: plain causal attention. Returns out (T, Hq, D) and the
    blocks each (token, KV head) attended."""
    T, Hq, D = q.shape
    L, Hkv = k.shape[0], k.shape[1]
    assert L == p0 + T and Hq % Hkv == 0
    G = Hq // Hkv
    dense = force_dense or L < sp.dense_len
    # The selection is a set of block indices: no gradient flows through it,
    # and the compressed keys feed nothing else (training: docs/minicpm-sala.md).
    with torch.no_grad():
        c = compressed_keys(k.detach(), sp.kernel_size, sp.kernel_stride)  # (n, Hkv, D)
    out = torch.zeros_like(q)
    chosen = []
    for t in range(T):
        p = p0 + t
        row = []
        for g in range(Hkv):
            with torch.no_grad():
                blocks = select(q[t, g * G:(g + 1) * G].detach(), c[:, g], p, sp, scale, dense)
            row.append(blocks)
            idx = torch.cat([torch.arange(b * sp.block_size, min((b + 1) * sp.block_size, p + 1)) for b in blocks])
            for h in range(g * G, (g + 1) * G):
                w = torch.softmax((k[idx, g] @ q[t, h]) * scale, 0)
                out[t, h] = w @ v[idx, g]
        chosen.append(row)
    return out, chosen


# ---------------------------------------------------------------- the model


class Config:
    """config.json as the published model names its keys."""

    def __init__(self, d):
        self.d = d
        self.hidden = d["hidden_size"]
        self.layers = d["num_hidden_layers"]
        self.heads = d["num_attention_heads"]
        self.kv_heads = d["num_key_value_heads"]
        self.head_dim = d.get("head_dim") or self.hidden // self.heads
        self.lightning_nkv = d.get("lightning_nkv", self.kv_heads)
        self.eps = d.get("rms_norm_eps", 1e-6)
        self.theta = d.get("rope_theta", 10000.0)
        self.mixers = d["mixer_types"]
        self.sparse = Sparse(d.get("sparse_config") or {})
        # The published modeling code builds its lightning layers with
        # num_attention_heads and head_dim (not lightning_nh / lightning_head_dim)
        # and its sparse layers with hidden_size // num_attention_heads; it is
        # followed, and a config where the names disagree is refused.
        for key, want in (("lightning_nh", self.heads), ("lightning_head_dim", self.head_dim)):
            if d.get(key, want) != want:
                raise ValueError(f"{key} = {d[key]} differs from the {want} the published code uses")
        if self.hidden // self.heads != self.head_dim:
            raise ValueError("head_dim must be hidden_size / num_attention_heads (the sparse layers' head size)")
        if d.get("lightning_scale", "1/sqrt(d)") != "1/sqrt(d)" or d.get("attention_bias", False):
            raise ValueError("only lightning_scale 1/sqrt(d) and attention_bias false are implemented")
        if d.get("rope_scaling") or d.get("attn_use_rope", False):
            raise ValueError("rope_scaling and attn_use_rope = true are not implemented")
        self.depth_scale = d["scale_depth"] / math.sqrt(self.layers)
        self.head_scale = self.hidden / d["dim_model_base"]
        self.slopes = torch.tensor(alibi_slopes(self.heads), dtype=torch.float64)


class Cache:
    """Per layer: (k, v) rows so far for a sparse layer, the (H, D, D) state for a lightning one."""

    def __init__(self, cfg):
        self.pos = 0
        self.kv = [None] * cfg.layers
        self.state = [None] * cfg.layers


def lightning_core(q, k, v, slopes, scale, S):
    """Simple gated linear attention with a fixed decay per head, the
    recurrence fla's simple GLA computes in chunks: q, k, v (T, H, D), slopes
    (H), S (H, D, D) the state before; S_t = exp(-slope_h) S_{t-1} + k_t^T v_t,
    o_t = scale q_t S_t. Returns o (T, H, D) and the state after."""
    decay = torch.exp(-slopes)[:, None, None]
    o = torch.empty_like(q)
    S = S.clone()
    for t in range(q.shape[0]):
        S = decay * S + k[t, :, :, None] * v[t, :, None, :]
        o[t] = torch.einsum("hd,hde->he", q[t], S) * scale
    return o, S


def lightning(cfg, W, pre, x, pos, state):
    """x (T, hidden) normed input; returns (T, hidden) and the new state."""
    T, H, D = x.shape[0], cfg.heads, cfg.head_dim
    q = (x @ W[pre + "q_proj.weight"].T).view(T, H, D)
    k = (x @ W[pre + "k_proj.weight"].T).view(T, cfg.lightning_nkv, D)
    v = (x @ W[pre + "v_proj.weight"].T).view(T, cfg.lightning_nkv, D)
    if cfg.d.get("qk_norm", True):
        q, k = rms_norm(q, W[pre + "q_norm.weight"], cfg.eps), rms_norm(k, W[pre + "k_norm.weight"], cfg.eps)
    if cfg.d.get("lightning_use_rope", False):
        q, k = rope(q, pos, cfg.theta), rope(k, pos, cfg.theta)
    rep = H // cfg.lightning_nkv
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    S = torch.zeros(H, D, D, dtype=torch.float64) if state is None else state
    o, S = lightning_core(q, k, v, cfg.slopes, 1 / math.sqrt(D), S)
    o = o.reshape(T, H * D)
    if cfg.d.get("use_output_norm", False):
        o = rms_norm(o, W[pre + "o_norm.weight"], cfg.eps)  # one norm over every head's output together
    if cfg.d.get("use_output_gate", False):
        o = o * torch.sigmoid(x @ W[pre + "z_proj.weight"].T)
    return o @ W[pre + "o_proj.weight"].T, S


def sparse_layer(cfg, W, pre, x, p0, kv, force_dense):
    T, H, D, Hkv = x.shape[0], cfg.heads, cfg.head_dim, cfg.kv_heads
    q = (x @ W[pre + "q_proj.weight"].T).view(T, H, D)
    k = (x @ W[pre + "k_proj.weight"].T).view(T, Hkv, D)
    v = (x @ W[pre + "v_proj.weight"].T).view(T, Hkv, D)
    if kv is not None:
        k, v = torch.cat([kv[0], k]), torch.cat([kv[1], v])
    o, _ = sparse_attention(q, k, v, p0, cfg.sparse, 1 / math.sqrt(D), force_dense)
    o = o.reshape(T, H * D)
    if cfg.d.get("attn_use_output_gate", False):
        o = o * torch.sigmoid(x @ W[pre + "o_gate.weight"].T)
    return o @ W[pre + "o_proj.weight"].T, (k, v)


def forward(cfg, W, ids, cache, force_dense=False):
    """One call: ids (T) after cache.pos earlier tokens; returns logits (T, V)."""
    T = len(ids)
    pos = torch.arange(cache.pos, cache.pos + T)
    h = W["model.embed_tokens.weight"][torch.as_tensor(ids)] * cfg.d["scale_emb"]
    for i in range(cfg.layers):
        pre = f"model.layers.{i}."
        x = rms_norm(h, W[pre + "input_layernorm.weight"], cfg.eps)
        if cfg.mixers[i] in LIGHTNING:
            a, cache.state[i] = lightning(cfg, W, pre + "self_attn.", x, pos, cache.state[i])
        elif cfg.mixers[i] == SPARSE:
            a, cache.kv[i] = sparse_layer(cfg, W, pre + "self_attn.", x, cache.pos, cache.kv[i], force_dense)
        else:
            raise ValueError(f"unknown mixer type {cfg.mixers[i]!r}")
        h = h + a * cfg.depth_scale
        x = rms_norm(h, W[pre + "post_attention_layernorm.weight"], cfg.eps)
        m = (torch.nn.functional.silu(x @ W[pre + "mlp.gate_proj.weight"].T) * (x @ W[pre + "mlp.up_proj.weight"].T))
        h = h + (m @ W[pre + "mlp.down_proj.weight"].T) * cfg.depth_scale
    cache.pos += T
    h = rms_norm(h, W["model.norm.weight"], cfg.eps)
    return (h / cfg.head_scale) @ W["lm_head.weight"].T


def chunked(cfg, W, prompt, chunks, cache):
    """The prompt in calls of the given sizes (each call decides dense or sparse
    from its own last position, as the published forward does); (T, V) logits."""
    out, at = [], 0
    for n in chunks:
        out.append(forward(cfg, W, prompt[at:at + n], cache))
        at += n
    assert at == len(prompt)
    return torch.cat(out)


def greedy(cfg, W, prompt, n, chunks=None):
    """Prefill in one call (or in calls of `chunks` tokens), then one token per
    call; returns the n new ids."""
    cache = Cache(cfg)
    logits = forward(cfg, W, prompt, cache) if chunks is None else chunked(cfg, W, prompt, chunks, cache)
    out = []
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        logits = forward(cfg, W, [out[-1]], cache)
    return out


# ---------------------------------------------------------------- the tiny checkpoint


def tiny_config_b():
    """A second tiny config: other sizes and the optional pieces the first has on
    turned off (no QK-norm, no RoPE, no output gates; the output norm kept),
    lightning k/v heads = query heads (the published ratio), 4 sparse KV heads
    of 8 query heads, kernel 2 x stride as published, a one-block local
    window, another layer order."""
    d = tiny_config()
    d.update({"hidden_size": 32, "intermediate_size": 24, "num_hidden_layers": 3, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 4, "lightning_nh": 8, "lightning_nkv": 8, "lightning_head_dim": 4,
              "lightning_use_rope": False, "qk_norm": False, "use_output_gate": False, "use_output_norm": True,
              "attn_use_output_gate": False, "mixer_types": ["lightning-attn", "minicpm4", "lightning-attn"],
              "scale_emb": 8, "scale_depth": 1.2, "dim_model_base": 16, "rms_norm_eps": 1e-5,
              "rope_theta": 5000.0,
              "sparse_config": {"kernel_size": 8, "kernel_stride": 4, "block_size": 8, "topk": 3, "init_blocks": 1,
                                "window_size": 8, "dense_len": 40, "use_nope": False}})
    return d


def tiny_config():
    """A small config with every published option on; its sparse_config scaled
    so a 72-token prompt is past dense_len with more candidate blocks than slots."""
    return {
        "architectures": ["MiniCPMSALAForCausalLM"], "model_type": "minicpm_sala",
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "lightning_nh": 4, "lightning_nkv": 2, "lightning_head_dim": 8, "lightning_scale": "1/sqrt(d)",
        "lightning_use_rope": True, "attn_use_rope": False, "qk_norm": True, "use_output_gate": True,
        "use_output_norm": True, "attn_use_output_gate": True, "attention_bias": False,
        "mixer_types": ["minicpm4", "lightning-attn", "lightning-attn", "minicpm4"],
        "scale_emb": 12, "scale_depth": 1.4, "dim_model_base": 8, "mup_denominator": 32,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None, "hidden_act": "silu",
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "pretraining_tp": 1,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "torch_dtype": "bfloat16",
        "sparse_config": {"kernel_size": 4, "kernel_stride": 2, "block_size": 8, "topk": 3, "init_blocks": 1,
                          "window_size": 16, "dense_len": 48, "use_nope": False},
    }


def tiny_weights(cfg, gen):
    """Random weights with the published checkpoint's names, bf16-rounded."""
    d, Hd = cfg.d, cfg.hidden
    qd, kvd, F = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, d["intermediate_size"]
    shapes = {"model.embed_tokens.weight": (d["vocab_size"], Hd)}
    for i, m in enumerate(cfg.mixers):
        pre = f"model.layers.{i}."
        a = pre + "self_attn."
        lkv = cfg.lightning_nkv * cfg.head_dim
        shapes[pre + "input_layernorm.weight"] = (Hd,)
        shapes[a + "q_proj.weight"] = (qd, Hd)
        shapes[a + "k_proj.weight"] = (lkv if m in LIGHTNING else kvd, Hd)
        shapes[a + "v_proj.weight"] = (lkv if m in LIGHTNING else kvd, Hd)
        shapes[a + "o_proj.weight"] = (Hd, qd)
        if m in LIGHTNING:  # only the modules the config turns on (as the published code builds them)
            if d.get("qk_norm", True):
                shapes[a + "q_norm.weight"] = (cfg.head_dim,)
                shapes[a + "k_norm.weight"] = (cfg.head_dim,)
            if d.get("use_output_norm", False):
                shapes[a + "o_norm.weight"] = (qd,)
            if d.get("use_output_gate", False):
                shapes[a + "z_proj.weight"] = (qd, Hd)
        elif d.get("attn_use_output_gate", False):
            shapes[a + "o_gate.weight"] = (qd, Hd)
        shapes[pre + "post_attention_layernorm.weight"] = (Hd,)
        shapes[pre + "mlp.gate_proj.weight"] = (F, Hd)
        shapes[pre + "mlp.up_proj.weight"] = (F, Hd)
        shapes[pre + "mlp.down_proj.weight"] = (Hd, F)
    shapes["model.norm.weight"] = (Hd,)
    shapes["lm_head.weight"] = (d["vocab_size"], Hd)
    W = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            w = 1.0 + 0.3 * torch.randn(shape, generator=gen)  # gains around 1, not ones
        elif name == "model.embed_tokens.weight":
            w = 0.1 * torch.randn(shape, generator=gen)  # scale_emb 12 brings it to ~1
        else:
            w = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
        W[name] = w.to(torch.bfloat16)
    return W


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", choices=["a", "b"], default="a", help="a: tiny_config, b: tiny_config_b")
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--seed", type=int, default=35)
    args = ap.parse_args()
    from safetensors.torch import save_file
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(args.seed)
    d = tiny_config() if args.variant == "a" else tiny_config_b()
    if args.out_dir is None:
        args.out_dir = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures",
                                    "minicpm_sala_tiny" + ("" if args.variant == "a" else "_b"))
    cfg = Config(d)
    Wb = tiny_weights(cfg, gen)
    W = {n: w.to(torch.float64) for n, w in Wb.items()}
    V = d["vocab_size"]
    long = torch.randint(3, V, (72,), generator=gen).tolist()  # past dense_len 48: sparse
    short = torch.randint(3, V, (21,), generator=gen).tolist()  # dense
    logits_long = forward(cfg, W, long, Cache(cfg))
    logits_dense = forward(cfg, W, long, Cache(cfg), force_dense=True)  # the same prompt, sparse layers dense
    logits_short = forward(cfg, W, short, Cache(cfg))
    gap = (logits_long - logits_dense).abs().max().item()
    if gap < 1e-3:  # the sparse selection must matter on this prompt, else the fixture checks nothing
        raise SystemExit(f"sparse and dense logits differ by only {gap:.2e}: pick another seed")
    gen_ids = greedy(cfg, W, long, 6)
    # A chunked prefill (the engine's with --max-tokens-per-step dense_len - 4;
    # a: 44 + 28 tokens): the first call dense (it ends below dense_len; its
    # last queries would drop a block if sparse), the second sparse.
    first = cfg.sparse.dense_len - 4
    chunks = [first, len(long) - first]
    logits_chunked = chunked(cfg, W, long, chunks, Cache(cfg))
    gen_chunked = greedy(cfg, W, long, 6, chunks)
    cgap = (logits_chunked - logits_long).abs().max().item()
    if cgap < 1e-3:
        raise SystemExit(f"chunked and one-call logits differ by only {cgap:.2e}: the chunked case checks nothing")
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(d, f, indent=1)
        f.write("\n")
    save_file({n: w.contiguous() for n, w in Wb.items()}, os.path.join(args.out_dir, "model.safetensors"),
              metadata={"format": "pt"})
    ref = {"tokens_long": torch.tensor(long, dtype=torch.int32), "logits_long": logits_long.float(),
           "logits_long_dense": logits_dense.float(), "tokens_short": torch.tensor(short, dtype=torch.int32),
           "logits_short": logits_short.float(), "greedy_long": torch.tensor(gen_ids, dtype=torch.int32),
           "logits_long_chunked": logits_chunked.float(),
           "greedy_long_chunked": torch.tensor(gen_chunked, dtype=torch.int32),
           "chunks": torch.tensor(chunks, dtype=torch.int32)}
    save_file(ref, os.path.join(args.out_dir, "reference.safetensors"),
              metadata={"generator": f"minicpm_sala_ref.py --seed {args.seed}, torch {torch.__version__}"})
    print(f"wrote {args.out_dir}: sparse-vs-dense logit gap {gap:.3f}, greedy {gen_ids}; chunked {chunks}: "
          f"gap {cgap:.3f}, greedy {gen_chunked}")


if __name__ == "__main__":
    main()
