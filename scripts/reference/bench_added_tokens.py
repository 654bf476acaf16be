#!/usr/bin/env python3
"""Encode speed with a large added-token set, tpr against Hugging Face
`tokenizers`, side by side on the same machine and text.

Takes the byte-level fixture tokenizer (tests/fixtures/tokenizer/bytelevel),
adds N special tokens <unusedK> (as Gemma ships ~6,000), and encodes ~1 MB of
mixed text (the fixture strings, an added token every ~2 KB) on one thread.
tpr is timed through `tpr tokenize --file` less the time of the same command
on an empty file (process start and loading), best of 3. Checks that tpr's
ids equal the library's, then prints one row per tpr binary: seconds per MB
and speed relative to the library (> 1: tpr faster).

Usage: bench_added_tokens.py [--added 6000] [--mb 1] TPR [TPR...]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
from tokenizers import Tokenizer  # noqa: E402

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/fixtures/tokenizer/bytelevel")


def best_of(n, fn):
    best = None
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best = dt if best is None or dt < best else best
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tpr", nargs="+")
    ap.add_argument("--added", type=int, default=6000)
    ap.add_argument("--mb", type=float, default=1.0)
    a = ap.parse_args()
    j = json.load(open(os.path.join(FIX, "tokenizer.json")))
    base = max(max(j["model"]["vocab"].values()), max(t["id"] for t in j["added_tokens"])) + 1
    for k in range(a.added):
        j["added_tokens"].append({"id": base + k, "content": f"<unused{k}>", "single_word": False, "lstrip": False,
                                  "rstrip": False, "normalized": False, "special": True})
    r = random.Random(3)
    strings = [json.loads(line)["t"] for line in open(os.path.join(FIX, "cases.jsonl")) if '"t"' in line]
    parts, size = [], 0
    while size < a.mb * 1e6:
        s = r.choice(strings) + " "
        if r.random() < 0.02:
            s += f"<unused{r.randrange(a.added)}>" if a.added else ""
        parts.append(s)
        size += len(s.encode())
    text = "".join(parts)
    mb = len(text.encode()) / 1e6
    with tempfile.TemporaryDirectory() as d:
        tok_path, txt, empty = (os.path.join(d, n) for n in ("tokenizer.json", "text.txt", "empty.txt"))
        json.dump(j, open(tok_path, "w"))
        open(txt, "w").write(text)
        open(empty, "w").write("x")
        hf = Tokenizer.from_file(tok_path)
        want = hf.encode(text, add_special_tokens=False).ids
        t_hf = best_of(3, lambda: hf.encode(text, add_special_tokens=False))
        print(f"{mb:.2f} MB of text, {a.added} added tokens, one thread")
        print(f"| encoder | s/MB | speed vs tokenizers |\n|---|---|---|")
        print(f"| tokenizers {__import__('tokenizers').__version__} | {t_hf / mb:.3f} | 1.00 |")
        for tpr in a.tpr:
            cmd = [tpr, "tokenize", "--model", tok_path, "--no-special", "--file"]
            out = json.loads(subprocess.run(cmd[:-1] + ["--json", "--file", txt], check=True, capture_output=True).stdout)
            if out["ids"] != want:
                sys.exit(f"{tpr}: ids differ from the library's")
            t_load = best_of(3, lambda: subprocess.run(cmd + [empty], check=True, capture_output=True))
            t_all = best_of(3, lambda: subprocess.run(cmd + [txt], check=True, capture_output=True))
            t = max(t_all - t_load, 1e-9)
            print(f"| {tpr} | {t / mb:.3f} | {t_hf / t:.2f} |")


if __name__ == "__main__":
    main()
