#!/usr/bin/env python3
"""Unigram and bigram baselines of the demo model's validation loss.

Counts come from the training tokens only; the loss is the mean
-log p(target) over exactly the targets `tpr eval --seq-len T` scores
(windows w = tokens [w*T, w*T + T + 1) of the validation file, the target of
position t predicted from the input token at t).

  unigram       add-one:  p(b) = (c(b) + 1) / (N + V)
  bigram add-1  p(b | a) = (c(a, b) + 1) / (c(a) + V)
  bigram interp p(b | a) = l * c(a, b) / c(a) + (1 - l) * p_uni(b)   (c(a) = 0: p_uni)
                l chosen on the last 5% of the training tokens with counts
                from the rest, then the counts refitted on all of them.

Usage: baselines.py --train train.npy --val val.npy --vocab 4096 [--seq-len 256] [--out baselines.json]
"""
import argparse
import json

import numpy as np


def targets(val, T):
    nw = (len(val) - 1) // T
    idx = np.arange(nw * T)
    return val[idx].astype(np.int64), val[idx + 1].astype(np.int64)  # (prev, target), window order


def fit(tokens, V):
    uni = np.bincount(tokens, minlength=V).astype(np.float64)
    big = np.zeros((V, V), dtype=np.float64)
    np.add.at(big, (tokens[:-1], tokens[1:]), 1.0)
    return uni, big


def losses(uni, big, prev, tgt, V, lam):
    p_uni = (uni + 1) / (uni.sum() + V)
    row = big.sum(axis=1)
    out = {"unigram": float(-np.mean(np.log(p_uni[tgt])))}
    out["bigram_add_one"] = float(-np.mean(np.log((big[prev, tgt] + 1) / (row[prev] + V))))
    ml = np.where(row[prev] > 0, big[prev, tgt] / np.maximum(row[prev], 1), 0.0)
    lam_eff = np.where(row[prev] > 0, lam, 0.0)
    out["bigram_interpolated"] = float(-np.mean(np.log(lam_eff * ml + (1 - lam_eff) * p_uni[tgt])))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--val", required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--out")
    a = ap.parse_args()
    V, T = a.vocab, a.seq_len
    train = np.load(a.train).astype(np.int64)
    val = np.load(a.val).astype(np.int64)
    cut = int(len(train) * 0.95)
    uni, big = fit(train[:cut], V)
    dprev, dtgt = train[cut:-1], train[cut + 1:]
    best = min((losses(uni, big, dprev, dtgt, V, l)["bigram_interpolated"], l) for l in np.arange(0.05, 1.0, 0.05))
    lam = float(round(best[1], 2))
    uni, big = fit(train, V)
    prev, tgt = targets(val, T)
    out = losses(uni, big, prev, tgt, V, lam)
    out.update({"lambda": lam, "val_targets": int(len(tgt)), "seq_len": T, "train_tokens": int(len(train))})
    print(json.dumps(out))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
