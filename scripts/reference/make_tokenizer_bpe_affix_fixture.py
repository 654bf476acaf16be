#!/usr/bin/env python3
"""Parity fixtures for BPE with continuing_subword_prefix / end_of_word_suffix,
the BPEDecoder and RobertaProcessing (tests/test_tokenizer_components.c).

Trains tiny BPE models with the Hugging Face `tokenizers` library
(`BpeTrainer` with the prefix or suffix) on the mixed text of
make_tokenizer_components_fixture.py, and writes under
tests/fixtures/tokenizer_components/:

  NAME.json    the tokenizer.json
  NAME.jsonl   one case per line: {"t": text, "s": 1, "ids": encode(t, add_special_tokens=True),
               "d": decode(ids)} (specials skipped)

  bpe_prefix             "##" prefix, BertNormalizer, BertPreTokenizer, unk,
                         RobertaProcessing, WordPiece decoder
  bpe_suffix             "</w>" suffix, Whitespace, unk, BPEDecoder
  bpe_suffix_bytelevel   "</w>" suffix after a CLIP-like Split and ByteLevel
                         without its regex, ByteLevel decoder

Usage: make_tokenizer_bpe_affix_fixture.py [--out DIR] [--seed 7] [--cases 120]
"""
import argparse
import json
import os
import random
import sys

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers as pt, processors, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tokenizer_components_fixture as comp  # noqa: E402  (its mixed text)


def build(name, corpus_texts):
    if name == "bpe_prefix":
        tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##"))
        tok.normalizer = normalizers.BertNormalizer()
        tok.pre_tokenizer = pt.BertPreTokenizer()
        tr = trainers.BpeTrainer(vocab_size=500, special_tokens=["[UNK]", "<s>", "</s>"], limit_alphabet=120,
                                 continuing_subword_prefix="##", show_progress=False)
    elif name == "bpe_suffix":
        tok = Tokenizer(models.BPE(unk_token="[UNK]", end_of_word_suffix="</w>"))
        tok.pre_tokenizer = pt.Whitespace()
        tr = trainers.BpeTrainer(vocab_size=500, special_tokens=["[UNK]"], limit_alphabet=120,
                                 end_of_word_suffix="</w>", show_progress=False)
    else:
        tok = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
        tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "),
                                               normalizers.Lowercase()])
        tok.pre_tokenizer = pt.Sequence([pt.Split(Regex(r"'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"),
                                                  "removed", invert=True),
                                         pt.ByteLevel(add_prefix_space=False, use_regex=False)])
        tr = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pt.ByteLevel.alphabet(),
                                 end_of_word_suffix="</w>", show_progress=False)
    tok.train_from_iterator(corpus_texts, tr)
    if name == "bpe_prefix":
        tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                          ("<s>", tok.token_to_id("<s>")))
        tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    elif name == "bpe_suffix":
        tok.decoder = decoders.BPEDecoder(suffix="</w>")
    else:
        tok.decoder = decoders.ByteLevel()
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "../../tests/fixtures/tokenizer_components"))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--cases", type=int, default=120)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    corpus_texts = comp.texts(random.Random(a.seed), 600)
    for name in ["bpe_prefix", "bpe_suffix", "bpe_suffix_bytelevel"]:
        tok = build(name, corpus_texts)
        with open(os.path.join(a.out, name + ".json"), "w") as f:
            f.write(tok.to_str())
        with open(os.path.join(a.out, name + ".jsonl"), "w") as f:
            for t in comp.texts(random.Random(f"{a.seed}-{name}"), a.cases):
                ids = tok.encode(t, add_special_tokens=True).ids
                f.write(json.dumps({"t": t, "s": 1, "ids": ids, "d": tok.decode(ids)}, ensure_ascii=False) + "\n")
        print(f"{name}: vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
