#!/usr/bin/env python3
"""Parity fixtures for the pre-tokenizers and normalizers beyond the common
ones (tests/test_tokenizer_components.c).

For each configuration below, trains a tiny BPE with the Hugging Face
`tokenizers` library on generated mixed text (code, numbers, CJK, emoji,
punctuation, whitespace runs; the corpus of make_tokenizer_fixture.py plus
code), and writes under tests/fixtures/tokenizer_components/:

  NAME.json    the tokenizer.json (added_flags: lower_bytelevel's with 300 short,
               overlapping added tokens with random flags)
  NAME.jsonl   one case per line: {"t": text, "ids": encode(t), "d": decode(ids)} (specials skipped)
               (without a decoder, decode joins the tokens with spaces)

Usage: make_tokenizer_components_fixture.py [--out DIR] [--seed 7] [--cases 110]
"""
import argparse
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers as pt, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tokenizer_fixture as base  # noqa: E402  (its random text generator)

CODE = ["def f(x):\n    return x + 1\n", "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
        "if x != None and y >= 10:\n        print(f\"{x!r}\")", "const y = arr.map((v) => v * 2); // 42",
        "#include <stdio.h>\nint main(void) { return 0; }", "SELECT id, name FROM users WHERE age > 30;",
        "x = [1, 2, 3] + [4_000, 5.5e-3]", "   \n\n  \t  \t\n", "a--b--c...d", "foo::bar->baz()",
        "1234567 89 0.5 12,345,678 2026-11-27", "café naïve ÉCOLE İstanbul ǅ ß Σσς", "ｆｕｌｌ１２３",
        "e\u0301 a\u0308 \u0915\u094d\u0937", "«quoted» “curly” ‘single’ — dash … ellipsis", "50% of $100 = $50!!",
        "x|y&z^w~v`u", "٣٤٥ ½ ²³ Ⅻ", "emoji 👍🏽🎉 and 🇫🇷", "你好，世界！ 123 abc", "  leading and trailing  "]

BL = pt.ByteLevel(add_prefix_space=False, use_regex=False)


def seq(*steps):
    return pt.Sequence(list(steps))


# name -> (pre_tokenizer, normalizer, byte_level)
CONFIGS = {
    "starcoder": (seq(pt.Digits(individual_digits=True), pt.ByteLevel(add_prefix_space=False, use_regex=True)),
                  None, True),
    "digits_group": (seq(pt.Digits(individual_digits=False), pt.ByteLevel(add_prefix_space=True)), None, True),
    "falcon": (seq(pt.Punctuation("contiguous"), pt.ByteLevel(add_prefix_space=False, use_regex=True),
                   pt.Digits(individual_digits=False), pt.Split(Regex("[0-9][0-9][0-9]"), "isolated")), None, True),
    "bytelevel_first": (seq(pt.ByteLevel(add_prefix_space=True, use_regex=True),
                            pt.Split(Regex(r"\d{1,2}"), "isolated"), pt.Digits(individual_digits=True)), None, True),
    "punct_isolated": (seq(pt.Punctuation("isolated"), BL), None, True),
    "punct_removed": (seq(pt.Punctuation("removed"), BL), None, True),
    "punct_prev": (seq(pt.Punctuation("merged_with_previous"), BL), None, True),
    "punct_next": (seq(pt.Punctuation("merged_with_next"), BL), None, True),
    "punct_contiguous": (seq(pt.Punctuation("contiguous"), BL), None, True),
    "split_str_next": (seq(pt.Split(" ", "merged_with_next"), BL), None, True),
    "split_invert_removed": (seq(pt.Split(Regex(r"\p{L}+|\p{N}+"), "removed", invert=True), BL), None, True),
    "split_contiguous": (seq(pt.Split(Regex(r"\s"), "contiguous"), BL), None, True),
    "whitespace": (pt.Whitespace(), normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents(),
                                                          normalizers.Lowercase()]), False),
    "whitespace_split": (pt.WhitespaceSplit(), normalizers.Strip(), False),
    "bert": (pt.BertPreTokenizer(), normalizers.Sequence([normalizers.NFKD(), normalizers.Lowercase()]), False),
    "char_delim": (pt.CharDelimiterSplit("-"), normalizers.Strip(left=False, right=True), False),
    "lower_bytelevel": (seq(pt.Digits(individual_digits=True), BL),
                        normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(),
                                              normalizers.Strip(left=True, right=False)]),
                        True),
}


def texts(r, n):
    out = list(CODE)
    while len(out) < n:
        out.append(r.choice(CODE) + base.rand_text(r, None, 3) if r.random() < 0.2 else base.rand_text(r, None, 7))
    return out


ADDED_ALPHABET = "ab<>_u1 "


def with_added(tok, r, n=300):
    """Adds n short, overlapping tokens over a small alphabet with random
    single_word / lstrip / rstrip / normalized / special flags."""
    seen = set()
    while len(seen) < n:
        c = "".join(r.choice(ADDED_ALPHABET) for _ in range(r.randint(2, 7))).strip()
        if c and c not in seen and tok.token_to_id(c) is None:
            seen.add(c)
            tok.add_tokens([AddedToken(c, single_word=r.random() < 0.2, lstrip=r.random() < 0.2,
                                       rstrip=r.random() < 0.2, normalized=r.random() < 0.5,
                                       special=r.random() < 0.5)])


def added_texts(r, n):
    return ["".join(r.choice(ADDED_ALPHABET + "xyz.") for _ in range(r.randint(1, 80))) if r.random() < 0.7
            else base.rand_text(r, None, 5) for _ in range(n)]


def train(name, corpus_texts):
    """Trains on whole texts (no splitting), then sets the pipeline under test:
    merges then span the pipeline's boundaries, so every splitting step changes
    the ids and a dropped or reordered step shows (the negative controls)."""
    pre, norm, byte_level = CONFIGS[name]
    if byte_level:
        tok = Tokenizer(models.BPE())
        tr = trainers.BpeTrainer(vocab_size=420, initial_alphabet=pt.ByteLevel.alphabet(), show_progress=False)
        tok.decoder = decoders.ByteLevel()
    else:  # characters outside the small alphabet become <unk>
        tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
        tr = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>"], limit_alphabet=150, show_progress=False)
    if byte_level:
        tok.pre_tokenizer = BL
    tok.train_from_iterator(corpus_texts, tr)
    tok.pre_tokenizer = pre
    if norm is not None:
        tok.normalizer = norm
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "../../tests/fixtures/tokenizer_components"))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--cases", type=int, default=110)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    r = random.Random(a.seed)
    corpus_texts = texts(r, 600)
    for name in list(CONFIGS) + ["added_flags"]:
        if name == "added_flags":  # lower_bytelevel's pipeline with overlapping added tokens
            tok = train("lower_bytelevel", corpus_texts)
            with_added(tok, random.Random(a.seed))
        else:
            tok = train(name, corpus_texts)
        with open(os.path.join(a.out, name + ".json"), "w") as f:
            f.write(tok.to_str())
        rc = random.Random(f"{a.seed}-{name}")
        with open(os.path.join(a.out, name + ".jsonl"), "w") as f:
            for t in (added_texts(rc, a.cases) if name == "added_flags" else texts(rc, a.cases)):
                ids = tok.encode(t, add_special_tokens=False).ids
                case = {"t": t, "ids": ids, "d": tok.decode(ids)}
                f.write(json.dumps(case, ensure_ascii=False) + "\n")
        print(f"{name}: vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
