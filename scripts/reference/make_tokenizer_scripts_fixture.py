#!/usr/bin/env python3
"""Parity fixtures for the UnicodeScripts pre-tokenizer
(tests/test_tokenizer_components.c), against the Hugging Face `tokenizers`
library.

Trains tiny models with that library on generated mixed-script text (Latin,
CJK, Hiragana and Katakana with U+30FC, Cyrillic, Greek, Arabic, Hebrew,
Devanagari, Thai, Hangul, digits, punctuation, emoji, combining marks, spaces
and other whitespace) as whole texts, so merges span script boundaries and a
wrong split changes the ids; then sets the pipeline under test:

  scripts_bpe        UnicodeScripts alone, BPE (unk, fuse_unk)
  scripts_bytelevel  [UnicodeScripts, ByteLevel without its regex], byte-level BPE
  scripts_wordpiece  [UnicodeScripts, Whitespace], WordPiece
  scripts_unigram    [UnicodeScripts, Metaspace], Unigram
  scripts_table      UnicodeScripts alone, a BPE whose vocabulary is only <unk>
                     (fused): one <unk> per piece, so the ids count the pieces.
                     Its texts walk the library's script table
                     (make_hf_unicode_scripts_table.py): each range's first and
                     last code point and the one after it, a few ranges a text,
                     so every boundary of the table is checked.

Writes NAME.json and NAME.jsonl ({"t": text, "ids": encode(t), "d": decode(ids)})
under tests/fixtures/tokenizer_components/.

Usage: make_tokenizer_scripts_fixture.py [--out DIR] [--seed 11] [--cases 70]
"""
import argparse
import json
import os
import random
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers as pt, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_hf_unicode_scripts_table as table  # noqa: E402

POOLS = {
    "latin": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZéüñçßøå",
    "han": "日本語中文字学生東京大会社人物时间问题你好世界漢",
    "hira": "あいうえおかきくけこさしすせそのにはをんがぎゃっ",
    "kata": "アイウエオカキクケコサシスセソノニハヲンガギャッヴ",
    "mark": "ー",
    "cyr": "абвгдежзийклмнопрстуфхцчшщыьэюяДЖЯ",
    "greek": "αβγδεζηθικλμνξοπρστυφχψωΩΣ",
    "arabic": "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "hebrew": "אבגדהוזחטיכלמנסעפצקרשת",
    "deva": "अआइईउएकखगघचजटडतदनपबमयरलवसह\u093e\u093f\u0940\u094d",
    "thai": "กขคงจฉชซญดตถทนบปผพฟภมยรลวศสหอฮะาิีึืุู",
    "hangul": "한국어텍스트가나다라마",
    "digit": "0123456789٠١٢٣",
    "punct": ".,;:!?()[]{}-_'\"/\\@#$%&*+=<>、。「」！？・",
    "emoji": ["👍", "🎉", "😀", "👍🏽", "🇫🇷", "👨\u200d👩\u200d👧"],
    "comb": "\u0301\u0308\u0327\u3099\u309a\u064b\u05b7\u0e31",
}
SPACES = [" ", " ", " ", "  ", "\t", "\n", "\u3000", "\u00a0", "\u2003", " \n "]


def word(r):
    k = r.choice(list(POOLS))
    pool = POOLS[k]
    n = r.randint(1, 2 if k in ("emoji", "comb", "mark", "punct") else 7)
    s = "".join(r.choice(pool) for _ in range(n))
    if k == "kata" and r.random() < 0.5:
        s += "ー"  # the prolonged sound mark after kana, its usual place
    if r.random() < 0.15:
        s += r.choice(POOLS["comb"])
    return s


def rand_text(r, n_words):
    parts = []
    for _ in range(r.randint(1, n_words)):
        parts.append(word(r))
        u = r.random()
        if u < 0.45:
            parts.append(" ")
        elif u < 0.6:
            parts.append(r.choice(SPACES))
    s = "".join(parts)
    if r.random() < 0.15:
        s = r.choice(SPACES) + s  # leading whitespace: dropped before the first script
    return s


FIXED = ["", " ", "   ", "どこで生れ。Yes", "Apples are りんご 林檎", "hi 京", " hi", "ラーメン ramen Рамен",
         "コーヒー☕とケーキ", "ー", "ーabc", "abc ー def", "مرحبا بالعالم hello שלום", "नमस्ते दुनिया 123",
         "สวัสดีครับ ok", "Ελληνικά and русский", "e\u0301cole caf\u00e9", "\u3099\u309a alone",
         "tab\there\nnew\u3000line\u00a0nbsp", "２０２６年１１月２７日", "👍🏽 emoji 🇫🇷", "a" + " " * 10 + "b"]


def texts(r, n, n_words=9):
    out = list(FIXED)
    while len(out) < n:
        out.append(rand_text(r, n_words))
    return out


def table_texts(r):
    """Each range's first and last code point and the one after it, a few
    ranges a text, with a space now and then (Any inside a run)."""
    fixed, _ = table.probe()
    cps = sorted(fixed)
    bounds = []
    for i, c in enumerate(cps):
        if i == 0 or cps[i - 1] != c - 1 or fixed[cps[i - 1]] != fixed[c]:
            bounds.append(c)
    chars = []
    for c in bounds:
        for d in (c - 1, c, c + 1):
            if 0 < d < 0x110000 and not 0xD800 <= d <= 0xDFFF:
                chars.append(chr(d))
    out = []
    for i in range(0, len(chars), 18):
        t = chars[i:i + 18]
        if r.random() < 0.3:
            t.insert(r.randint(0, len(t)), " ")
        out.append("".join(t))
    return out


def train(name, corpus):
    if name == "scripts_table":
        tok = Tokenizer(models.BPE(vocab={"<unk>": 0}, merges=[], unk_token="<unk>", fuse_unk=True))
        tok.pre_tokenizer = pt.UnicodeScripts()
        return tok
    if name == "scripts_bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pt.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, initial_alphabet=pt.ByteLevel.alphabet(),
                                                            show_progress=False))
        tok.pre_tokenizer = pt.Sequence([pt.UnicodeScripts(), pt.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
    elif name == "scripts_bpe":
        tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
        tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=650, special_tokens=["<unk>"],
                                                            show_progress=False))
        tok.pre_tokenizer = pt.UnicodeScripts()
    elif name == "scripts_wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=40))
        tok.pre_tokenizer = pt.WhitespaceSplit()
        tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=650, special_tokens=["[UNK]"],
                                                                  show_progress=False))
        tok.pre_tokenizer = pt.Sequence([pt.UnicodeScripts(), pt.Whitespace()])
        tok.decoder = decoders.WordPiece()
    else:  # scripts_unigram
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pt.Metaspace()
        tok.train_from_iterator(corpus, trainers.UnigramTrainer(vocab_size=700, special_tokens=["<unk>"],
                                                                unk_token="<unk>", show_progress=False))
        tok.pre_tokenizer = pt.Sequence([pt.UnicodeScripts(), pt.Metaspace()])
        tok.decoder = decoders.Metaspace()
    return tok


NAMES = ["scripts_bpe", "scripts_bytelevel", "scripts_wordpiece", "scripts_unigram", "scripts_table"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "../../tests/fixtures/tokenizer_components"))
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--cases", type=int, default=70)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    corpus = texts(random.Random(a.seed), 800, 25)
    for name in NAMES:
        tok = train(name, corpus)
        with open(os.path.join(a.out, name + ".json"), "w") as f:
            f.write(tok.to_str())
        rc = random.Random(f"{a.seed}-{name}")
        cases = table_texts(rc) if name == "scripts_table" else texts(rc, a.cases)
        with open(os.path.join(a.out, name + ".jsonl"), "w") as f:
            for t in cases:
                ids = tok.encode(t, add_special_tokens=False).ids
                case = {"t": t, "ids": ids}
                if name != "scripts_table":
                    case["d"] = tok.decode(ids)
                f.write(json.dumps(case, ensure_ascii=False) + "\n")
        print(f"{name}: vocab {tok.get_vocab_size()}, {len(cases)} cases")


if __name__ == "__main__":
    main()
