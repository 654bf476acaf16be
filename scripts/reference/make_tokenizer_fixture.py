#!/usr/bin/env python3
"""Tokenizer parity fixtures for tests/test_tokenizer.c.

Trains small tokenizers with the Hugging Face `tokenizers` library on a
generated multilingual corpus and writes, per tokenizer, a directory under
tests/fixtures/tokenizer/ with

  tokenizer.json          the trained tokenizer (what a checkpoint ships)
  tokenizer_config.json   bos/eos names, as transformers writes them
  cases.jsonl             one JSON object per line:
      {"t": text, "ids": encode(t, add_special_tokens=True)
       [, "ns": encode(t, add_special_tokens=False) when it differs]
       [, "d": decode(ns) when it differs from t]  (ns: ids when "ns" is absent)
       [, "ds": decode(ids, skip_special_tokens=True) when it differs from d]}
    or a decode-only case of random ids:
      {"di": ids, "d": decode(ids), "ds": decode(ids, skip_special_tokens=True)}

Tokenizers:
  bytelevel  Qwen2-style byte-level BPE: NFC, Split(Qwen2 regex, Isolated) +
             ByteLevel(use_regex=false), ByteLevel decoder; special and
             non-special added tokens (lstrip/rstrip/single_word flags).
  metaspace  Mistral-style BPE with byte_fallback: Metaspace pre-tokenizer
             (prepend_scheme first), <0xNN> byte tokens in the vocab,
             decoder Sequence[Replace, ByteFallback, Fuse, Strip], <s> template.
  llama      the same model with Llama's legacy normalizer
             Sequence[Prepend("▁"), Replace(" ", "▁")] and no pre-tokenizer.

Usage: make_tokenizer_fixture.py [--out tests/fixtures/tokenizer] [--seed 15]
"""
import argparse
import json
import os
import random

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

WORDS = ("the of and to in is you that it he was for on are as with his they at be this have from or one had by "
         "word but not what all were we when your can said there use an each which she do how their if will up "
         "other about out many then them these so some her would make like him into time has look two more write "
         "go see number no way could people my than first water been call who oil its now find long down day did "
         "get come made may part don't I'll we've she'd it's you're THEY'RE I'M tokenizer parity byte-level merge "
         "naïve café résumé Zürich façade São Paulo Ελληνικά русский язык français español").split()
CJK = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持音究" \
      "こんにちは世界ありがとうございますカタカナひらがな日本語" "안녕하세요세계감사합니다한국어"
EMOJI = ["😀", "😂", "🥲", "👍", "👍🏽", "🎉", "🚀", "❤️", "👨‍👩‍👧‍👦", "🇫🇷", "🇯🇵", "🏳️‍🌈", "🤖", "✨", "🔥", "🧪", "1️⃣"]
COMBINING = ["e\u0301", "a\u0308", "n\u0303", "o\u0302", "c\u0327", "A\u030a", "\u1100\u1161\u11a8",
             "i\u0307\u0301", "u\u0308\u0304", "\u0915\u094d\u0937", "\u05e9\u05c1", "Z\u0351\u036b\u0343"]
SPACES = [" ", "  ", "   ", "\n", "\n\n", "\t", "\t\t", "\r\n", " \n ", "\n \n", "    ", " \t\n", "\u3000", "\u00a0",
          "\u2003", "\u2028", "\x0b", "\x0c", "\u0085"]
PUNCT = list(".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`") + ["...", "--", "->", "==", "!=", "//", "#!", "''"]


def rand_number(r):
    k = r.randint(0, 5)
    if k == 0:
        return str(r.randint(0, 9))
    if k == 1:
        return str(r.randint(0, 10 ** r.randint(1, 12)))
    if k == 2:
        return f"{r.uniform(-1000, 1000):.{r.randint(1, 5)}f}"
    if k == 3:
        return "٣٤٥" if r.random() < 0.5 else "１２３"  # non-ASCII digits (\p{N})
    if k == 4:
        return f"{r.randint(1, 31)}/{r.randint(1, 12)}/{r.randint(1900, 2100)}"
    return "½" if r.random() < 0.5 else "²³"


def rand_unicode(r, n):
    out = []
    for _ in range(n):
        plane = r.random()
        if plane < 0.5:
            cp = r.randint(0x20, 0xFFFF)
        elif plane < 0.8:
            cp = r.randint(0x80, 0x7FF)
        else:
            cp = r.randint(0x10000, 0x10FFFF)
        if 0xD800 <= cp <= 0xDFFF:  # surrogates are not text
            cp = 0xFFFD
        out.append(chr(cp))
    return "".join(out)


def rand_piece(r):
    k = r.random()
    if k < 0.45:
        w = r.choice(WORDS)
        return w.upper() if r.random() < 0.05 else (w.capitalize() if r.random() < 0.1 else w)
    if k < 0.6:
        return "".join(r.choice(CJK) for _ in range(r.randint(1, 6)))
    if k < 0.67:
        return r.choice(EMOJI)
    if k < 0.72:
        return r.choice(COMBINING)
    if k < 0.8:
        return rand_number(r)
    if k < 0.9:
        return r.choice(PUNCT)
    return rand_unicode(r, r.randint(1, 3))


def rand_text(r, specials, max_pieces=14):
    parts = []
    for _ in range(r.randint(1, max_pieces)):
        parts.append(rand_piece(r))
        u = r.random()
        if u < 0.6:
            parts.append(" ")
        elif u < 0.75:
            parts.append(r.choice(SPACES))
        if specials and r.random() < 0.06:
            parts.append(r.choice(specials))
    s = "".join(parts)
    if r.random() < 0.1:
        s = r.choice(SPACES) + s
    if r.random() < 0.1:
        s = s + r.choice(SPACES)
    return s


def corpus(r, n):
    return [rand_text(r, None, 30) for _ in range(n)]


def fixed_cases(specials):
    sp = specials[0]
    return ["", " ", "  ", "\n", "\n\n\n", "\t \t", "   leading", "trailing   ", "a  b   c    d", "x\r\ny\r\n\r\nz",
            "Hello, world!", "I'll be there; we've got it. DON'T STOP", "1234567890", "3.14159 2.71828",
            "你好，世界！", "日本語のテキスト", "한국어 텍스트", "😀😀😀", "👨‍👩‍👧‍👦 family", "café vs cafe\u0301",
            "e\u0301\u0301\u0301", "\u00a0\u3000\u2003", f"{sp}", f"{sp}{sp}", f"a{sp}b", f" {sp} ", f"\n{sp}\n",
            "def f(x):\n    return x + 1\n", "<|notspecial|>", "<s", "s>", "<<s>>", "ｆｕｌｌｗｉｄｔｈ", "\u200b\u200d",
            "\uffff\U0010ffff\U0001f600", "Ωmega µ ﬁ ℌ", "x" * 300, "ab" * 100, " " * 50, "\n" * 20]


def train_bytelevel(r, texts):
    t = Tokenizer(models.BPE())
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    tr = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    t.train_from_iterator(texts, tr)
    t.add_tokens([AddedToken("<think>", special=False, normalized=False),
                  AddedToken("</think>", special=False, normalized=False),
                  AddedToken("hello world", special=False, normalized=True)])
    t.add_special_tokens([AddedToken("[L]", special=True, lstrip=True, normalized=False),
                          AddedToken("[R]", special=True, rstrip=True, normalized=False),
                          AddedToken("wordx", special=True, single_word=True, normalized=False)])
    config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "hello world", "[L]", "[R]",
                "wordx"]
    return t, config, specials


def metaspace_model(texts):
    t = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tr = trainers.BpeTrainer(vocab_size=1500, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=300,
                             show_progress=False)
    t.train_from_iterator(texts, tr)
    # SentencePiece keeps the 256 byte tokens <0x00>..<0xFF> in the model's
    # vocab right after the specials: put them there, renumbering the rest.
    j = json.loads(t.to_str())
    old = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {}
    for tok, _ in old[:3]:
        vocab[tok] = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for tok, _ in old[3:]:
        if tok not in vocab:
            vocab[tok] = len(vocab)
    j["model"]["vocab"] = vocab
    return j


def finish_metaspace(j, legacy):
    j = json.loads(json.dumps(j))
    if legacy:
        j["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
        j["pre_tokenizer"] = None
    t = Tokenizer.from_str(json.dumps(j))
    t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)])
    t.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                     special_tokens=[("<s>", 1)])
    t.add_special_tokens([AddedToken("[INST]", special=True, normalized=False),
                          AddedToken("[/INST]", special=True, normalized=False)])
    config = {"bos_token": {"content": "<s>", "__type": "AddedToken"}, "eos_token": "</s>", "unk_token": "<unk>"}
    specials = ["<s>", "</s>", "<unk>", "[INST]", "[/INST]"]
    return t, config, specials


def write(out, name, t, config, specials, r, n_cases, n_decode):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    t.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)
    texts = fixed_cases(specials) + [rand_text(r, specials) for _ in range(n_cases)]
    vocab = t.get_vocab_size(with_added_tokens=True)
    with open(os.path.join(d, "cases.jsonl"), "w", encoding="utf-8") as f:
        for s in texts:
            ids = t.encode(s, add_special_tokens=True).ids
            c = {"t": s, "ids": ids}
            ns = t.encode(s, add_special_tokens=False).ids
            if ns != ids:
                c["ns"] = ns
            dec = t.decode(ns, skip_special_tokens=False)
            if dec != s:
                c["d"] = dec
            ds = t.decode(ids, skip_special_tokens=True)
            if ds != dec:
                c["ds"] = ds
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
        for _ in range(n_decode):
            ids = [r.randrange(vocab) for _ in range(r.randint(1, 12))]
            while "\0" in t.decode(ids):  # C strings (cJSON) end at NUL: no NUL in decoded text
                ids = [r.randrange(vocab) for _ in range(r.randint(1, 12))]
            f.write(json.dumps({"di": ids, "d": t.decode(ids, skip_special_tokens=False),
                                "ds": t.decode(ids, skip_special_tokens=True)}, ensure_ascii=False) + "\n")
    print(f"{name}: vocab {vocab}, {len(texts)} strings + {n_decode} decode cases -> {d}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/tokenizer")
    ap.add_argument("--seed", type=int, default=15)
    a = ap.parse_args()
    r = random.Random(a.seed)
    texts = corpus(r, 4000)
    t, config, specials = train_bytelevel(r, texts)
    write(a.out, "bytelevel", t, config, specials, r, 2200, 200)
    j = metaspace_model(texts)
    t, config, specials = finish_metaspace(j, legacy=False)
    write(a.out, "metaspace", t, config, specials, r, 1960, 200)
    t, config, specials = finish_metaspace(j, legacy=True)
    write(a.out, "llama", t, config, specials, r, 260, 100)


if __name__ == "__main__":
    main()
