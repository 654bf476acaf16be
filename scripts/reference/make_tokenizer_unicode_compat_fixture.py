#!/usr/bin/env python3
"""Parity fixtures for the normal forms on code points newer than the
reference library's Unicode tables (tokenizer/tok_unicode_compat.c,
tests/test_tokenizer_components.c).

Each tokenizer is a normalizer in front of a byte-level BPE with the 256 byte
tokens and no merges, so its ids are the bytes of the normalized text, as the
library computes it: NFC, NFD, NFKC, NFKD and BertNormalizer with
strip_accents (an NFD inside, then no Mn), and StripAccents. The strings mix the code points of
make_hf_unicode_norm_table.py's table (combining marks and decompositions the
library does not know) with older combining marks, composable letters and
compatibility characters, so the reordering, composition and decomposition
around them all show, and with the code points the library does not call
(nonspacing) marks, punctuation (unicode_punct: BertPreTokenizer) or
characters for clean_text to drop while utf8proc's category does, or the
other way round; and (unicode_regex) with code points the library's regex
engine knows and PCRE2 10.42 does not, under a Llama 3 kind of Split pattern;
and (unicode_grapheme) with marks its grapheme clusters take in and utf8proc's
do not, behind a Precompiled charsmap. The script checks that utf8proc alone (what tpr did
before) differs from the library on a third of the strings or more, so the fixture can fail.

Writes under tests/fixtures/tokenizer_components/: unicode_{nfc,nfd,nfkc,nfkd,bert,strip,clean,punct,regex,grapheme}.json / .jsonl
({"t": text, "ids": encode(t), "d": decode(ids)}).

Usage: make_tokenizer_unicode_compat_fixture.py [--out DIR] [--cases 50]
"""
import argparse
import json
import os
import random
import sys

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers as pt, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_hf_unicode_norm_table as tab  # noqa: E402  (utf8proc through ctypes)

HERE = os.path.dirname(os.path.abspath(__file__))
NEW = [0x7FD, 0x898, 0x89F, 0x8CA, 0x8D3, 0x9FE, 0xC3C, 0xD3B, 0xEBA, 0x1715, 0x1ABF, 0x1ACE, 0x1DF6, 0x32FF, 0xA7F2,
       0xA82C, 0xAB69, 0x10781, 0x107B0, 0x10D24, 0x10EFD, 0x10F46, 0x10F82, 0x11070, 0x1133B, 0x1145E, 0x11839,
       0x11938, 0x1193D, 0x119E0, 0x11A34, 0x11D42, 0x11F41, 0x16FF0, 0x1E030, 0x1E08F, 0x1E130, 0x1E2AE, 0x1E2EC,
       0x1E4EC, 0x1F16C, 0x1FBF0, 0x1FBF9]
OLD = ["\u0301", "\u0316", "\u0334", "\u05b0", "\u0308", "\u0327", "\u093c", "\u0e38", "\u302a"]
BASE = ["a", "e", "o", "A", "\u1100", "\u1161", "\u304b", "\u3099", "\ufb01", "\u2460", "\u00bd", "\uff21", " ", "x",
        "\u0915", "\u0f40", "\u1e9b", "\u212b"]
FORMS = {"nfc": normalizers.NFC(), "nfd": normalizers.NFD(), "nfkc": normalizers.NFKC(), "nfkd": normalizers.NFKD(),
         "bert": normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=False, strip_accents=True,
                                            lowercase=False),
         "strip": normalizers.StripAccents(),
         "clean": normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False, strip_accents=False,
                                             lowercase=False)}


def texts(r, n, differs, new):
    out = [chr(c) for c in new[::max(1, len(new) // 6)]]
    while len(out) < n * 2 // 3:  # a mark the library does not know between two it does, where it shows
        s = r.choice(BASE) + r.choice(OLD) + chr(r.choice(new)) + r.choice(OLD) + r.choice(BASE + [""])
        if differs(s):
            out.append(s)
    while len(out) < n:
        s = []
        for _ in range(r.randrange(2, 9)):
            k = r.random()
            s.append(chr(r.choice(new)) if k < 0.4 else r.choice(OLD) if k < 0.75 else r.choice(BASE))
        out.append("".join(s))
    return out


def tokenizer(norm):
    bl = pt.ByteLevel(add_prefix_space=False, use_regex=False)
    vocab = {ch: i for i, ch in enumerate(sorted(pt.ByteLevel.alphabet()))}
    t = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    t.normalizer = norm
    t.pre_tokenizer = bl
    t.decoder = decoders.ByteLevel()
    return t


def punctuation(r, a, punct):
    """BertPreTokenizer in front of a byte-level BPE trained on the unsplit
    strings, so that where the text is cut shows in the ids: letters around
    the code points whose being punctuation the library decides otherwise
    than utf8proc."""
    letters = ["a", "b", "x", "\u00e9", "\u4e00", "\u0915", "1"]
    cases = [r.choice(letters) + chr(c) + r.choice(letters) for c in punct[::3]]
    while len(cases) < a.cases:
        cases.append("".join(r.choice(letters) + chr(r.choice(punct)) for _ in range(r.randrange(1, 5))) + "a")
    bl = pt.ByteLevel(add_prefix_space=False, use_regex=False)
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = bl
    t.train_from_iterator(cases * 5, trainers.BpeTrainer(vocab_size=500, initial_alphabet=pt.ByteLevel.alphabet(),
                                                        show_progress=False))
    # what tpr did before: these code points cut as utf8proc's category says
    # (nearly all are punctuation to utf8proc and not to the library)
    from tokenizers import Regex
    cls = "".join(f"\\x{{{c:X}}}" for c in punct)
    t.pre_tokenizer = pt.Sequence([pt.Split(Regex(f"[{cls}]"), "isolated"), pt.BertPreTokenizer(), bl])
    whole = [t.encode(s).ids for s in cases]
    t.pre_tokenizer = pt.Sequence([pt.BertPreTokenizer(), bl])
    t.decoder = decoders.ByteLevel()
    cut = 0
    with open(os.path.join(a.out, "unicode_punct.jsonl"), "w", encoding="utf-8") as f:
        for s, w in zip(cases, whole):
            ids = t.encode(s).ids
            cut += ids != w
            f.write(json.dumps({"t": s, "ids": ids, "d": t.decode(ids)}, ensure_ascii=False) + "\n")
    t.save(os.path.join(a.out, "unicode_punct.json"))
    print(f"unicode_punct: {len(cases)} strings, the cuts change the ids of {cut}")
    if cut < len(cases) // 3:
        sys.exit("unicode_punct: the fixture would not catch a wrong cut")


# Llama 3's / GPT-4o's kind of pattern: \p{L}, \p{N}, \p{Lu}, \p{Ll}, \p{M}... in and out of classes
PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+|\p{So}+|\p{Po}")


def regex_case(r, a, props):
    """A Split with PATTERN in front of a byte-level BPE trained on the
    unsplit strings; the strings hold code points the library's regex engine
    puts in a category and PCRE2 10.42 does not know. Each string is checked
    to split otherwise when they are replaced by an unassigned code point
    (what PCRE2 10.42 sees), so the fixture can fail."""
    from tokenizers import Regex
    pool = sorted(set(c for v in props.values() for c in v))
    sel = pool[::max(1, len(pool) // 300)]
    parts = ["a", "B", "7", " ", "!", "\u00e9", "\u4e00", "\u0301", ".", "'s"]
    bl = pt.ByteLevel(add_prefix_space=False, use_regex=False)
    split = pt.Split(Regex(PATTERN), "isolated")
    cases = []
    while len(cases) < a.cases:
        s = "".join(chr(r.choice(sel)) if r.random() < 0.4 else r.choice(parts) for _ in range(r.randrange(2, 9)))
        old = "".join("\u0378" if ord(ch) in set(pool) else ch for ch in s)
        if [o for _, o in split.pre_tokenize_str(s)] != [o for _, o in split.pre_tokenize_str(old)]:
            cases.append(s)
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = bl
    t.train_from_iterator(cases * 5, trainers.BpeTrainer(vocab_size=400, initial_alphabet=pt.ByteLevel.alphabet(),
                                                        show_progress=False))
    t.pre_tokenizer = pt.Sequence([split, bl])
    t.decoder = decoders.ByteLevel()
    with open(os.path.join(a.out, "unicode_regex.jsonl"), "w", encoding="utf-8") as f:
        for s in cases:
            ids = t.encode(s).ids
            f.write(json.dumps({"t": s, "ids": ids, "d": t.decode(ids)}, ensure_ascii=False) + "\n")
    t.save(os.path.join(a.out, "unicode_regex.json"))
    print(f"unicode_regex: {len(cases)} strings, each split otherwise by an engine without these code points")


def grapheme_case(r, a, join):
    """The Precompiled charsmap of unigram_precompiled in front of byte
    tokens; strings where a mark in `join` (which the library's grapheme
    clusters take in and utf8proc 2.8's do not) follows a k, which the
    charsmap rewrites with its whole cluster: the library drops the mark, a
    cluster cut before it would keep it."""
    import base64
    fx = json.load(open(os.path.join(a.out, "unigram_precompiled.json")))
    n = fx["normalizer"]
    pc = next(x for x in n["normalizers"] if x["type"] == "Precompiled") if n["type"] == "Sequence" else n
    norm = normalizers.Precompiled(base64.b64decode(pc["precompiled_charsmap"]))
    t = tokenizer(norm)
    cases = []
    while len(cases) < a.cases:
        s = "".join(r.choice(["k" + chr(r.choice(join)), "a", " ", "k", "\u0301", "x" + chr(r.choice(join))])
                    for _ in range(r.randrange(1, 5)))
        if "k" + s[-1] not in s:
            s += "k" + chr(r.choice(join))
        cases.append(s)
    assert all(norm.normalize_str("k" + chr(c)) == norm.normalize_str("k") for c in join)
    with open(os.path.join(a.out, "unicode_grapheme.jsonl"), "w", encoding="utf-8") as f:
        for s in cases:
            ids = t.encode(s).ids
            f.write(json.dumps({"t": s, "ids": ids, "d": t.decode(ids)}, ensure_ascii=False) + "\n")
    t.save(os.path.join(a.out, "unicode_grapheme.json"))
    print(f"unicode_grapheme: {len(cases)} strings, each with k + a mark the charsmap's rule swallows")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "../../tests/fixtures/tokenizer_components"))
    ap.add_argument("--cases", type=int, default=50)
    ap.add_argument("--seed", type=int, default=17)
    a = ap.parse_args()
    r = random.Random(a.seed)
    sa, bert = tab.mark_flips()  # what the library does not call a mark
    punct, other = tab.class_flips()  # nor punctuation, nor a character clean_text drops
    punctuation(r, a, sorted(punct))
    regex_case(r, a, tab.regex_props())
    grapheme_case(r, a, sorted(tab.grapheme_flips()[0]))
    for name, norm in FORMS.items():
        t = tokenizer(norm)
        form = {"bert": "NFD", "strip": None, "clean": None}.get(name, name.upper())

        def plain_norm(s):  # utf8proc alone, as tpr did before
            if name == "strip":
                return "".join(ch for ch in s if not 6 <= tab.lib.utf8proc_category(ord(ch)) <= 8)
            if name == "clean":  # no Cc, Cf, Cs, Co (whitespace as the library: BASE has only " ")
                return "".join(ch for ch in s if not 26 <= tab.lib.utf8proc_category(ord(ch)) <= 29)
            u = tab.u8p(s, form)
            return "".join(ch for ch in u if tab.lib.utf8proc_category(ord(ch)) != 6) if name == "bert" else u

        new = NEW + (sorted(bert)[::7] if name == "bert" else sorted(sa)[::6] if name == "strip" else
                     sorted(other) if name == "clean" else [])
        cases = texts(r, a.cases, lambda s: plain_norm(s) != norm.normalize_str(s), new)
        plain = 0
        with open(os.path.join(a.out, f"unicode_{name}.jsonl"), "w", encoding="utf-8") as f:
            for s in cases:
                want = norm.normalize_str(s)
                plain += plain_norm(s) != want
                ids = t.encode(s).ids
                f.write(json.dumps({"t": s, "ids": ids, "d": t.decode(ids)}, ensure_ascii=False) + "\n")
        t.save(os.path.join(a.out, f"unicode_{name}.json"))
        print(f"unicode_{name}: {len(cases)} strings, utf8proc alone differs on {plain}")
        if plain < len(cases) // 3:
            sys.exit(f"unicode_{name}: the fixture would not catch plain utf8proc")


if __name__ == "__main__":
    main()
