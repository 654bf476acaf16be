#!/usr/bin/env python3
"""Parity fixtures for the Unigram model (tests/test_tokenizer_components.c):
Viterbi over the vocab's scores, unk_id (unknown characters fused into one
unk), byte_fallback, with the Metaspace pre-tokenizer as SentencePiece-derived
files (T5, ALBERT, XLNet) use it.

Trains a tiny Unigram with the Hugging Face `tokenizers` library
(`UnigramTrainer`) on the mixed text of make_tokenizer_components_fixture.py,
and writes under tests/fixtures/tokenizer_components/:

  NAME.json    the tokenizer.json
  NAME.jsonl   one case per line: {"t": text, "s": 1, "ids": encode(t, add_special_tokens=True),
               "d": decode(ids)} (specials skipped)

  unigram_t5     NFKC, Metaspace (prepend always, split), unk_id, "$A </s>"
                 template, Metaspace decoder
  unigram_bytes  the same vocab plus the 256 <0xNN> pieces and byte_fallback,
                 Metaspace (prepend first, no split), Llama's decoder chain
                 (Replace, ByteFallback, Fuse, Strip)

The strings to encode come from another seed than the training text, so they
hold characters the vocab lacks (unknowns, byte fallback).

Usage: make_tokenizer_unigram_fixture.py [--out DIR] [--seed 7] [--cases 150]
"""
import argparse
import json
import os
import random
import sys

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers as pt, processors, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tokenizer_components_fixture as comp  # noqa: E402  (its mixed text)


def build(corpus_texts):
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pt.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tr = trainers.UnigramTrainer(vocab_size=900, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>",
                                 max_piece_length=8, show_progress=False)
    tok.train_from_iterator(corpus_texts, tr)
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>",
                                                       special_tokens=[("</s>", tok.token_to_id("</s>"))])
    return tok


def with_bytes(tok):
    j = json.loads(tok.to_str())
    have = {p for p, _ in j["model"]["vocab"]}
    j["model"]["vocab"] += [[f"<0x{b:02X}>", 0.0] for b in range(256) if f"<0x{b:02X}>" not in have]
    j["model"]["byte_fallback"] = True
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    j["decoder"] = json.loads(decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                                 decoders.Fuse(), decoders.Strip(" ", 1, 0)]).__getstate__())
    return Tokenizer.from_str(json.dumps(j))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "../../tests/fixtures/tokenizer_components"))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--cases", type=int, default=150)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t5 = build(comp.texts(random.Random(a.seed), 300))
    for name, tok in [("unigram_t5", t5), ("unigram_bytes", with_bytes(t5))]:
        with open(os.path.join(a.out, name + ".json"), "w") as f:
            f.write(tok.to_str())
        unk = 0
        with open(os.path.join(a.out, name + ".jsonl"), "w") as f:
            for t in comp.texts(random.Random(f"{a.seed}-{name}"), a.cases) + ["", " ", "\u2581x", "<unk>"]:
                ids = tok.encode(t, add_special_tokens=True).ids
                unk += ids.count(tok.token_to_id("<unk>"))
                f.write(json.dumps({"t": t, "s": 1, "ids": ids, "d": tok.decode(ids)}, ensure_ascii=False) + "\n")
        print(f"{name}: vocab {tok.get_vocab_size()}, {unk} <unk> ids")


if __name__ == "__main__":
    main()
