#!/usr/bin/env python3
"""Writes tests/fixtures/sparse_attention/: InfLLM-v2 sparse attention as
minicpm_sala_ref.py defines it (docs/minicpm-sala.md), in float64 on float32
inputs, for test_sparse_attention (tpr's sparse_attention_paged op).

    scripts/reference/.venv/bin/python scripts/reference/make_sparse_attention_fixture.py \
        [--out-dir tests/fixtures/sparse_attention]

Hq 4 query heads over Hkv 2 KV heads of D 8; sparse_config kernel_size 4,
kernel_stride 2, block_size 8, topk 3, init_blocks 1, window_size 16 (2 local
blocks), dense_len 48. Cases (q (T, Hq, D), k and v (L, Hkv, D): the whole
sequence, cache rows then the call's rows; out (T, Hq, D)):
  a  prefill of 72 tokens from position 0 (past dense_len: sparse);
  b  3 more tokens of the same sequence at positions 72..74 (a chunk after a cache);
     k_ab, v_ab hold that sequence's 75 rows (case a reads the first 72);
  c  64 tokens whose keys repeat every block (period 8): every candidate block
     scores exactly the same, so the lower block indices win the ties;
  d  40 tokens (below dense_len: plain causal attention);
  a_swap: case a's output when each selection's worst chosen candidate is
     replaced by the best one left out (the control a test must tell apart).
Every choice between candidates is checked to be decided by a margin over
1e-9 or an exact tie, so a float64 implementation must pick the same blocks.
Files: float32 little-endian .npy; meta.json.
"""
import argparse
import json
import math
import os

import numpy as np
import torch

import minicpm_sala_ref as ref

HQ, HKV, D = 4, 2, 8
SPARSE = {"kernel_size": 4, "kernel_stride": 2, "block_size": 8, "topk": 3, "init_blocks": 1, "window_size": 16,
          "dense_len": 48}


def margins(q, k, p0, sp, scale):
    """The smallest nonzero gap between a chosen and a left-out candidate's
    score over every (token, group): the selection's distance from a flip."""
    c = ref.compressed_keys(k, sp.kernel_size, sp.kernel_stride)
    G = HQ // HKV
    worst = math.inf
    for t in range(q.shape[0]):
        p = p0 + t
        for g in range(HKV):
            scores = {}
            bs, s, ks = sp.block_size, sp.kernel_stride, sp.kernel_size
            qb = p // bs
            n_valid = min(c.shape[0], (p + 1 - ks) // s + 1 if p + 1 >= ks else 0)
            if n_valid == 0 or k.shape[0] < sp.dense_len:
                continue
            sc = torch.softmax((q[t, g * G:(g + 1) * G] @ c[:n_valid, g].T) * scale, -1).sum(0)
            for b in range(sp.init_blocks, qb - sp.local_blocks + 1):
                lo, hi = max(0, b * bs // s - (ks // s - 1)), min(n_valid, (b + 1) * bs // s)
                scores[b] = float(sc[lo:hi].max()) if hi > lo else 0.0
            chosen = set(ref.select_blocks(q[t, g * G:(g + 1) * G], c[:, g], p, sp, scale, False))
            inside = [v for b, v in scores.items() if b in chosen]
            outside = [v for b, v in scores.items() if b not in chosen]
            if inside and outside:
                gap = min(inside) - max(outside)
                assert gap >= 0, "the selection is not the top of the scores"
                if gap > 0:
                    worst = min(worst, gap)
    return worst


def swapped_select(q_g, c, p, sp, scale, dense):
    """select_blocks with one wrong block: the worst chosen candidate out, the best left-out one in."""
    blocks = ref.select_blocks(q_g, c, p, sp, scale, dense)
    if dense:
        return blocks
    bs, qb = sp.block_size, p // sp.block_size
    cand = [b for b in range(sp.init_blocks, qb - sp.local_blocks + 1)]
    chosen = [b for b in cand if b in blocks]
    left = [b for b in cand if b not in blocks]
    if not chosen or not left:
        return blocks
    big = ref.Sparse({**SPARSE, "topk": sp.topk + 1})
    plus = ref.select_blocks(q_g, c, p, big, scale, False)  # the next best block
    extra = [b for b in plus if b not in blocks][0]
    tiny = ref.Sparse({**SPARSE, "topk": sp.topk - 1})
    minus = ref.select_blocks(q_g, c, p, tiny, scale, False)
    dropped = [b for b in blocks if b not in minus][0]  # the worst chosen one
    return sorted((set(blocks) - {dropped}) | {extra})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures",
                                                      "sparse_attention"))
    ap.add_argument("--seed", type=int, default=350)
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(args.seed)
    sp = ref.Sparse(SPARSE)
    scale = 1 / math.sqrt(D)
    f32 = lambda *shape: torch.randn(*shape, generator=gen).float().double()  # f32 values, held in double
    arrays = {}

    # a, b: one sequence, a prefill of 72 then a chunk of 3.
    L = 75
    q_all, k, v = f32(L, HQ, D), f32(L, HKV, D), f32(L, HKV, D)
    out_a, sel_a = ref.sparse_attention(q_all[:72], k[:72], v[:72], 0, sp, scale)
    out_b, _ = ref.sparse_attention(q_all[72:], k, v, 72, sp, scale)
    out_swap, sel_swap = ref.sparse_attention(q_all[:72], k[:72], v[:72], 0, sp, scale, select=swapped_select)
    assert sel_swap != sel_a
    dense_a, _ = ref.sparse_attention(q_all[:72], k[:72], v[:72], 0, sp, scale, force_dense=True)
    m_ab = min(margins(q_all[:72], k[:72], 0, sp, scale), margins(q_all[72:], k, 72, sp, scale))
    arrays.update(q_a=q_all[:72], q_b=q_all[72:], k_ab=k, v_ab=v, out_a=out_a, out_b=out_b, out_a_swap=out_swap)

    # Plain causal attention is what the dense path must give.
    causal = torch.nn.functional.scaled_dot_product_attention(
        q_all[:72].transpose(0, 1), k[:72].repeat_interleave(2, 1).transpose(0, 1),
        v[:72].repeat_interleave(2, 1).transpose(0, 1), is_causal=True).transpose(0, 1)
    assert (causal - dense_a).abs().max() < 1e-12

    # c: keys repeating every block: exact ties between candidate blocks.
    kc = f32(8, HKV, D).repeat(8, 1, 1)
    qc, vc = f32(64, HQ, D), f32(64, HKV, D)
    out_c, sel_c = ref.sparse_attention(qc, kc, vc, 0, sp, scale)
    tail = sel_c[-1][0]  # the last token: init block 0, the 3 - 1 = 2 slots to blocks 1 and 2, local 6, 7
    assert tail == [0, 1, 2, 6, 7], tail
    arrays.update(q_c=qc, k_c=kc, v_c=vc, out_c=out_c)

    # d: below dense_len.
    qd, kd, vd = f32(40, HQ, D), f32(40, HKV, D), f32(40, HKV, D)
    out_d, sel_d = ref.sparse_attention(qd, kd, vd, 0, sp, scale)
    assert sel_d[-1][0] == list(range(5))
    arrays.update(q_d=qd, k_d=kd, v_d=vd, out_d=out_d)

    os.makedirs(args.out_dir, exist_ok=True)
    for name, a in arrays.items():
        path = os.path.join(args.out_dir, name + ".npy")
        np.save(path, np.ascontiguousarray(a.numpy(), dtype="<f4"))
        os.chmod(path, 0o644)
    meta = dict(Hq=HQ, Hkv=HKV, D=D, scale=scale, sparse_config=SPARSE, seed=args.seed, torch=torch.__version__,
                min_selection_margin=m_ab, selection_a_last_token=sel_a[-1], selection_c_last_token=sel_c[-1])
    with open(os.path.join(args.out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    gap = (out_a - out_swap).abs().max().item()
    print(f"wrote {args.out_dir}: min selection margin {m_ab:.2e}, one swapped block moves out by {gap:.3f}")


if __name__ == "__main__":
    main()
