#!/usr/bin/env python3
"""Parity fixtures for BERT-style tokenizers (tests/test_tokenizer_components.c):
the WordPiece model, BertNormalizer, the WordPiece decoder, and the
BertProcessing / TemplateProcessing post-processors.

Trains tiny WordPiece models with the Hugging Face `tokenizers` library on the
mixed text of make_tokenizer_components_fixture.py (code, numbers, CJK, emoji,
accents, control characters, whitespace runs), and writes under
tests/fixtures/tokenizer_components/:

  NAME.json    the tokenizer.json
  NAME.jsonl   one case per line: {"t": text, "s": 1, "ids": encode(t, add_special_tokens=True),
               "d": decode(ids)} (specials skipped)

  wordpiece_bert    BertNormalizer (defaults: lowercase, strip_accents null so it
                    follows lowercase), BertPreTokenizer, "##", BertProcessing,
                    WordPiece decoder with cleanup
  wordpiece_cased   BertNormalizer without lowercase and CJK padding but with
                    strip_accents, Whitespace, "@@", max_input_chars_per_word 8,
                    TemplateProcessing "[CLS] $A [SEP]", decoder without cleanup
  wordlevel         a WordLevel model (whole words or [UNK]) with BertNormalizer,
                    BertPreTokenizer, BertProcessing and no decoder

Usage: make_tokenizer_wordpiece_fixture.py [--out DIR] [--seed 7] [--cases 150]
"""
import argparse
import json
import os
import random
import sys

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers as pt, processors, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tokenizer_components_fixture as comp  # noqa: E402  (its mixed text)

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# Characters BertNormalizer's clean_text drops or turns into spaces (not NUL: the
# test reads each text as a C string).
CONTROL = ["\ufffd", "\x0b", "\x1c", "\x85", "\u200b", "\ue000", "\U000e0001", "\u00a0", "\u3000", "\t"]


def build_wordlevel(corpus_texts):
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer()
    tok.pre_tokenizer = pt.BertPreTokenizer()
    tok.train_from_iterator(corpus_texts, trainers.WordLevelTrainer(vocab_size=400, special_tokens=SPECIALS,
                                                                    show_progress=False))
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    return tok


def build(name, corpus_texts):
    if name == "wordlevel":
        return build_wordlevel(corpus_texts)
    cased = name == "wordpiece_cased"
    prefix = "@@" if cased else "##"
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix=prefix))
    if cased:
        tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False, strip_accents=True,
                                                    lowercase=False)
        tok.pre_tokenizer = pt.Whitespace()
    else:
        tok.normalizer = normalizers.BertNormalizer()
        tok.pre_tokenizer = pt.BertPreTokenizer()
    # A small vocab and alphabet: words split into several pieces, rare
    # characters make whole words [UNK].
    tr = trainers.WordPieceTrainer(vocab_size=500, special_tokens=SPECIALS, limit_alphabet=120,
                                   continuing_subword_prefix=prefix, show_progress=False)
    tok.train_from_iterator(corpus_texts, tr)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    if cased:
        tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                           special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
        tok.decoder = decoders.WordPiece(prefix=prefix, cleanup=False)
    else:
        tok.post_processor = processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))
        tok.decoder = decoders.WordPiece(prefix=prefix, cleanup=True)
    j = json.loads(tok.to_str())
    if cased:
        j["model"]["max_input_chars_per_word"] = 8
    return Tokenizer.from_str(json.dumps(j))


def cases(r, n):
    out = comp.texts(r, n)
    for i in range(len(out)):
        if r.random() < 0.2:  # control and odd whitespace characters inside the text
            k = r.randrange(len(out[i]) + 1)
            out[i] = out[i][:k] + r.choice(CONTROL) + out[i][k:]
    out += ["Don't stop , isn't it ? I'm here ! we're , they've", "naïve ÉCOLE Ǆ İ Ω", "a" * 9, "a" * 8, ""]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "../../tests/fixtures/tokenizer_components"))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--cases", type=int, default=150)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    corpus_texts = comp.texts(random.Random(a.seed), 600)
    for name in ["wordpiece_bert", "wordpiece_cased", "wordlevel"]:
        tok = build(name, corpus_texts)
        with open(os.path.join(a.out, name + ".json"), "w") as f:
            f.write(tok.to_str())
        unk = 0
        with open(os.path.join(a.out, name + ".jsonl"), "w") as f:
            for t in cases(random.Random(f"{a.seed}-{name}"), a.cases):
                ids = tok.encode(t, add_special_tokens=True).ids
                unk += ids.count(tok.token_to_id("[UNK]"))
                f.write(json.dumps({"t": t, "s": 1, "ids": ids, "d": tok.decode(ids)}, ensure_ascii=False) + "\n")
        print(f"{name}: vocab {tok.get_vocab_size()}, {unk} [UNK] ids")


if __name__ == "__main__":
    main()
