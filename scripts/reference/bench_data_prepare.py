#!/usr/bin/env python3
"""Tokens per second of `tpr data prepare` against Hugging Face tokenizers'
encode_batch on the same documents of a text file (docs/data.md).

    scripts/reference/.venv/bin/python scripts/reference/bench_data_prepare.py \
        --tpr build/bin/tpr --model tests/fixtures/demo_model --input corpus.txt [--workers 1 2]

The file is cut into documents as tpr does by default (runs of lines separated
by blank lines: empty or ASCII-whitespace-only); the file must be valid UTF-8
(so both tokenize the same documents). For each worker count, tpr runs once
into a temporary directory (its own seconds, from --json: reading, tokenizing
and writing the shards) and encode_batch runs on RAYON_NUM_THREADS=N threads
in a child process (tokenizing only: the documents are in memory before the
clock starts). The token counts must agree. Each figure is the best of
--repeat runs (default 3): on a shared machine the fastest run is the one
least slowed by other work.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ASCII_WS = b" \t\r\n\f\v"


def documents(data):
    docs, cur = [], []
    for line in data.split(b"\n"):
        if line.strip(ASCII_WS):
            cur.append(line)
        elif cur:
            docs.append(b"\n".join(cur))
            cur = []
    if cur:
        docs.append(b"\n".join(cur))
    out = []
    for d in docs:
        if d.endswith(b"\r"):
            d = d[:-1]
        out.append(d.decode("utf-8"))
    return out


def hf_child(args):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    docs = documents(open(args.input, "rb").read())
    t0 = time.perf_counter()
    enc = tok.encode_batch(docs, add_special_tokens=False)
    dt = time.perf_counter() - t0
    print(json.dumps({"tokens": sum(len(e.ids) for e in enc), "documents": len(docs), "seconds": dt}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tpr", default="build/bin/tpr")
    ap.add_argument("--model", default="tests/fixtures/demo_model")
    ap.add_argument("--input", required=True)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hf-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hf_child:
        hf_child(args)
        return
    size = os.path.getsize(args.input)
    print(f"input {args.input}: {size / 1e6:.1f} MB")
    print(f"{'workers':>7} {'tpr tok/s':>12} {'HF tok/s':>12} {'tpr/HF':>7} {'tokens':>10}")
    for w in args.workers:
        best_t = best_h = None
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as d:
                r = subprocess.run([args.tpr, "data", "prepare", "--model", args.model, "--input", args.input,
                                    "--output", os.path.join(d, "d"), "--workers", str(w), "--json"],
                                   capture_output=True, text=True, check=True)
                t = json.loads(r.stdout)
            env = dict(os.environ, RAYON_NUM_THREADS=str(w), TOKENIZERS_PARALLELISM="true")
            r = subprocess.run([sys.executable, __file__, "--hf-child", "--model", args.model, "--input", args.input],
                               capture_output=True, text=True, check=True, env=env)
            h = json.loads(r.stdout)
            if h["tokens"] != t["tokens"] or h["documents"] != t["documents"]:
                raise SystemExit(f"token counts differ: tpr {t['tokens']} in {t['documents']} documents, "
                                 f"HF {h['tokens']} in {h['documents']}")
            best_t = t if best_t is None or t["seconds"] < best_t["seconds"] else best_t
            best_h = h if best_h is None or h["seconds"] < best_h["seconds"] else best_h
        tr, hr = best_t["tokens"] / best_t["seconds"], best_h["tokens"] / best_h["seconds"]
        print(f"{w:>7} {tr:>12.0f} {hr:>12.0f} {tr / hr:>7.2f} {best_t['tokens']:>10}")


if __name__ == "__main__":
    main()
