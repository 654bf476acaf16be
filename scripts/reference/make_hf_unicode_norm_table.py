#!/usr/bin/env python3
"""The code points whose normalization the `tokenizers` library does not know.

The library's NFC/NFD/NFKC/NFKD come from a Unicode table older than
utf8proc's (it knows U+1E944, Unicode 9, and not U+1E133, Unicode 12): a
combining mark or a decomposition assigned since is, to it, a plain starter
with no decomposition. tpr normalizes with utf8proc, so on text holding such a
code point the two differ (found on real tokenizers, e.g. Claude's NFKC, by
scripts/reference/check_published_tokenizers.py).

This script finds them by differential testing, the library against utf8proc
(through ctypes, the same library tpr links): for every code point that
utf8proc gives a combining class, a decomposition or a composition, a few
probe strings are normalized in the four forms by both. A code point where
they differ goes in the table when treating it as inert (the text is
normalized in pieces around it, the code point copied as is) gives exactly the
library's output on every probe; the script checks that and prints the
ranges as C for tokenizer/tok_unicode_compat.c. It also prints the code
points whose being a mark (StripAccents) or a nonspacing mark
(BertNormalizer's strip_accents) the library decides otherwise than
utf8proc's category, checked on "a" + the code point, and the same for
punctuation (BertPreTokenizer, Punctuation) and BertNormalizer's clean_text;
and, per general category, the code points the library's regex engine
(Oniguruma, newer Unicode) matches with \p{X} that PCRE2 10.42 does not know.

Usage: make_hf_unicode_norm_table.py > /tmp/table.c  (a venv with `tokenizers`)
"""
import ctypes
import ctypes.util
import sys
import unicodedata

from tokenizers import normalizers, pre_tokenizers

lib = ctypes.CDLL(ctypes.util.find_library("utf8proc") or "libutf8proc.so.2")
lib.utf8proc_map.argtypes = [ctypes.c_char_p, ctypes.c_ssize_t, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
lib.utf8proc_map.restype = ctypes.c_ssize_t
lib.utf8proc_category.argtypes = [ctypes.c_int32]
lib.utf8proc_category.restype = ctypes.c_int
lib.utf8proc_version.restype = ctypes.c_char_p
libc = ctypes.CDLL(None)
STABLE, COMPAT, COMPOSE, DECOMPOSE = 1 << 1, 1 << 2, 1 << 3, 1 << 4
FORMS = {"NFC": STABLE | COMPOSE, "NFD": STABLE | DECOMPOSE, "NFKC": STABLE | COMPOSE | COMPAT,
         "NFKD": STABLE | DECOMPOSE | COMPAT}
HF = {"NFC": normalizers.NFC(), "NFD": normalizers.NFD(), "NFKC": normalizers.NFKC(), "NFKD": normalizers.NFKD()}


def u8p(s, form):
    b = s.encode()
    out = ctypes.c_void_p()
    n = lib.utf8proc_map(b, len(b), ctypes.byref(out), FORMS[form])
    assert n >= 0, s
    r = ctypes.string_at(out, n).decode()
    libc.free(out)
    return r


def probes(c):
    return [c, "a" + c + "\u0316", "a\u0316" + c, "a" + c + "\u0334", c + "\u0301", "e" + c, c + c, "\u1100" + c,
            "a" + c + "\u05b0" + "\u0301"]


def emulate(s, form, inert):
    """utf8proc on the pieces between inert code points, which are copied."""
    out, piece = [], []
    for ch in s:
        if ord(ch) in inert:
            out.append(u8p("".join(piece), form) if piece else "")
            out.append(ch)
            piece = []
        else:
            piece.append(ch)
    if piece:
        out.append(u8p("".join(piece), form))
    return "".join(out)


def ranges_of(cps):
    ranges = []
    for cp in sorted(cps):
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return ranges


def print_table(name, cps, comment):
    print(f"// {comment}")
    print(f"static const uint32_t {name}[][2] = {{")
    line = " "
    for a, b in ranges_of(cps):
        item = f" {{0x{a:X}, 0x{b:X}}},"
        if len(line) + len(item) > 110:
            print(line)
            line = " "
        line += item
    print(line)
    print("};")


def mark_flips():
    """Where the library's idea of a mark differs from utf8proc's category:
    StripAccents drops what it calls a combining mark (utf8proc: Mn, Mc, Me),
    BertNormalizer's strip_accents drops what it calls Mn (utf8proc: Mn), each
    from a table older than utf8proc's, and not the same one."""
    sa_n, bert_n = normalizers.StripAccents(), normalizers.BertNormalizer(
        clean_text=False, handle_chinese_chars=False, strip_accents=True, lowercase=False)
    sa, bert = set(), set()
    for cp in range(0x80, 0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        k, c = lib.utf8proc_category(cp), chr(cp)
        if (6 <= k <= 8) != (sa_n.normalize_str("a" + c) == "a"):
            sa.add(cp)
        if u8p(c, "NFD") == c and (k == 6) != (bert_n.normalize_str("a" + c) == "a"):
            bert.add(cp)
    return sa, bert


WS = set(range(9, 14)) | {0x20, 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000} | set(range(0x2000, 0x200B))


def class_flips():
    """Where the library's punctuation (BertPreTokenizer and Punctuation: ASCII
    punctuation or P*) and BertNormalizer's clean_text "other" characters
    (Cc, Cf, Co, Cs) differ from tpr's reading of utf8proc's categories,
    checked on "a" + the code point + "a"."""
    bert, punc = pre_tokenizers.BertPreTokenizer(), pre_tokenizers.Punctuation("isolated")
    clean = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False, strip_accents=False,
                                       lowercase=False)
    pf, of = set(), set()
    for cp in range(0x80, 0x110000):
        if 0xD800 <= cp < 0xE000 or cp in WS or cp == 0xFFFD:  # whitespace, U+FFFD: fixed sets in tpr
            continue
        c, k = chr(cp), lib.utf8proc_category(cp)
        hb = len(bert.pre_tokenize_str("a" + c + "a")) == 3
        assert hb == (len(punc.pre_tokenize_str("a" + c + "a")) == 3), hex(cp)  # one table for both
        if hb != (12 <= k <= 18):
            pf.add(cp)
        if (clean.normalize_str("a" + c + "a") == "aa") != (26 <= k <= 29):
            of.add(cp)
    return pf, of


RE_PROPS = ["L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No", "P", "Pc", "Pd", "Ps",
            "Pe", "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk", "So"]


def regex_props():
    """The code points the library's regex engine gives a general category
    and PCRE2 10.42 (Debian 12; Unicode 14, as this Python's unicodedata,
    which stands in for it) does not know: {property: [code points]}."""
    from tokenizers import Regex

    def matcher(prop):
        sp = pre_tokenizers.Split(Regex(prop), "removed")
        return lambda c: sp.pre_tokenize_str(c) == []

    known = matcher(r"\P{Cn}")
    new = [cp for cp in range(0x80, 0x110000) if not 0xD800 <= cp < 0xE000 and
           unicodedata.category(chr(cp)) == "Cn" and known(chr(cp))]
    return {p: [cp for cp in new if matcher(rf"\p{{{p}}}")(chr(cp))] for p in RE_PROPS}


def grapheme_flips():
    """Where the library's grapheme clusters (Precompiled looks up a whole
    cluster) join a code point to the one before it and utf8proc's break there,
    or the reverse: seen through the Precompiled charsmap of
    tests/fixtures/tokenizer_components/unigram_precompiled.json, whose rule
    for "k" rewrites a whole cluster that starts with k, on "k" + the code point."""
    import json
    import os
    fx = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                     "../../tests/fixtures/tokenizer_components/unigram_precompiled.json")))
    n = fx["normalizer"]
    pc = next(x for x in n["normalizers"] if x["type"] == "Precompiled") if n["type"] == "Sequence" else n
    norm = normalizers.Precompiled(__import__("base64").b64decode(pc["precompiled_charsmap"]))
    lib.utf8proc_grapheme_break.argtypes = [ctypes.c_int32, ctypes.c_int32]
    lib.utf8proc_grapheme_break.restype = ctypes.c_bool
    k = norm.normalize_str("k")
    join, split = set(), set()
    for cp in range(0x80, 0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        alone = norm.normalize_str(c)
        if alone == "":
            continue
        hf_join = norm.normalize_str("k" + c) == k
        u_join = not lib.utf8proc_grapheme_break(ord("k"), cp)
        if hf_join and not u_join:
            join.add(cp)
        elif u_join and not hf_join:
            split.add(cp)
    return join, split


def main():
    cands = []
    for cp in range(0x80, 0x110000):
        if 0xD800 <= cp < 0xE000 or lib.utf8proc_category(cp) == 0:  # surrogates, unassigned to utf8proc
            continue
        c = chr(cp)
        if any(u8p(c, f) != c for f in ("NFKD",)) or unicodedata.category(c) == "Cn" or \
                unicodedata.combining(c) or unicodedata.decomposition(c) or u8p("a" + c + "\u0316", "NFD") != "a" + c + "\u0316":
            cands.append(cp)
    differ = []
    for cp in cands:
        c = chr(cp)
        if any(HF[f].normalize_str(p) != u8p(p, f) for p in probes(c) for f in FORMS):
            differ.append(cp)
    inert = set(differ)
    bad = [cp for cp in differ
           if any(HF[f].normalize_str(p) != emulate(p, f, inert) for p in probes(chr(cp)) for f in FORMS)]
    inert -= set(bad)
    # the emulation must not break what already matched
    worse = [cp for cp in cands if cp not in inert and
             any(HF[f].normalize_str(p) != emulate(p, f, inert) for p in probes(chr(cp)) for f in FORMS)
             and cp not in bad]
    print(f"// {len(inert)} code points; utf8proc {lib.utf8proc_version().decode()}, "
          f"tokenizers {__import__('tokenizers').__version__}; {len(cands)} candidates tested, {len(differ)} "
          f"differed, {len(bad)} not fixed by this ({', '.join(f'U+{x:04X}' for x in bad[:12])})", file=sys.stderr)
    if worse:
        print(f"// made worse: {', '.join(f'U+{x:04X}' for x in worse[:20])}", file=sys.stderr)
    print_table("HF_NORM_INERT", inert, f"{len(inert)} code points the library's normal forms leave alone")
    sa, bert = mark_flips()
    print(f"// StripAccents flips: {len(sa)}, BertNormalizer strip_accents flips: {len(bert)}", file=sys.stderr)
    print_table("HF_MARK_FLIP", sa, f"{len(sa)} code points whose mark-ness (StripAccents) the library sees otherwise")
    print_table("HF_MN_FLIP", bert, f"{len(bert)} code points whose Mn-ness (BertNormalizer) the library sees otherwise")
    pf, of = class_flips()
    print(f"// punctuation flips: {len(pf)}, clean_text flips: {len(of)}", file=sys.stderr)
    print_table("HF_PUNCT_FLIP", pf, f"{len(pf)} code points the library calls punctuation otherwise than utf8proc")
    print_table("HF_OTHER_FLIP", of, f"{len(of)} code points BertNormalizer's clean_text drops otherwise than utf8proc")
    join, split = grapheme_flips()
    print(f"// grapheme: {len(join)} join in the library only, {len(split)} break in the library only", file=sys.stderr)
    print_table("HF_GRAPHEME_JOIN", join, f"{len(join)} code points the library's grapheme clusters join to the one "
                "before where utf8proc breaks")
    props = regex_props()
    print(f"// regex: {', '.join(f'{k} {len(v)}' for k, v in props.items())}", file=sys.stderr)
    for k, v in props.items():
        if v:
            print_table(f"HF_RE_{k}", v, f"\\p{{{k}}} to the library's regex engine, unassigned to PCRE2 10.42")
    print("static const re_prop RE_PROPS[] = {")
    for k, v in props.items():
        if v:
            print(f'    {{"{k}", HF_RE_{k}, sizeof HF_RE_{k} / sizeof HF_RE_{k}[0]}},')
    print("};")


if __name__ == "__main__":
    main()
