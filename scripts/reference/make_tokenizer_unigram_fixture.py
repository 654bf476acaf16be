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
  unigram_precompiled  unigram_t5 with a Precompiled normalizer (then a Regex
                 Replace of space runs, as T5's files have): a small
                 SentencePiece charsmap compiled from RULES below (full-width
                 letters and digits, ligatures, spaces, a rule for "k" and one
                 for "k" + U+0301, which shows the shortest-prefix lookup).
                 The charsmap is stored here as base64; --charsmap rebuilds it
                 with the `sentencepiece` package (0.2.x), which nothing else needs.
  unigram_nmt    unigram_t5 with Nmt, NFKC and the space-run Replace (the
                 layout of the library's SentencePieceUnigramTokenizer), on
                 text with control characters inserted

The strings to encode come from another seed than the training text, so they
hold characters the vocab lacks (unknowns, byte fallback).

Usage: make_tokenizer_unigram_fixture.py [--out DIR] [--seed 7] [--cases 150] [--charsmap]
"""
import argparse
import base64
import json
import os
import random
import sys

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers as pt, processors, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tokenizer_components_fixture as comp  # noqa: E402  (its mixed text)


RULES = ([(f"{c:X}", f"{c - 0xFEE0:X}") for c in [*range(0xFF10, 0xFF1A), *range(0xFF21, 0xFF3B), *range(0xFF41, 0xFF5B)]]
         + [("FB01", "66 69"), ("BD", "31 2044 32"), ("9", "20"), ("3000", "20"), ("A0", "20"), ("6B", "4B"),
            ("6B 301", "1E31"), ("65 301", "E9"), ("200B", "20"), ("2026", "2E 2E 2E"), ("1F44D", "3A 2B 31 3A"),
            ("C5", "41 30A")])
CHARSMAP = "AAQAAAAgAAAJDQAAAAAAgMwYAgCBBQAAlAAAgIEFAACXAACAoCkAAD0AAIAKAACAhR0AACcAAICAJAIAAgAAgIs1AACABAIAgE0AAIEFAABpAACABgAAgL19AAAIAACAEAAAgBIAAIAUAACAFgAAgBgAAIAaAACAHAAAgB4AAIAlAACArMwCACsAAICmsQAALQAAgC8AAIAxAACAMwAAgDUAAIA3AACAOQAAgDsAAIA9AACAPwAAgEEAAIBDAACARQAAgLxAAwC9wAAARwAAgEkAAIBLAACATQAAgE8AAIBRAACAUwAAgFUAAIBXAACAWQAAgFsAAIBdAACAXwAAgGEAAIBjAACAoXkBAKKNAQCjgQEApIEBAKWBAQCmgQEAp4EBAKiBAQCpgQEAqoEBAKuBAQCsgQEArYEBAK6BAQCvgQEAsIkBALGJAQCymQEAs5kBALSJAQC1iQEAtrkBALe5AQC4iQEAuYkBALqZAQBlAACAZwAAgGwAAIBuAACAcAAAgHIAAIB0AACAdgAAgGupAQB4AACAegAAgHwAAIB+AACAgAAAgIIAAICEAACAhgAAgIgAAIBliAIAigAAgIwAAICQkQEAkZ0BAJKVAQCTrQEAlLUBAJW9AQCWtQEAl60BAJiVAQCZnQEAjgAAgJAAAICSAACAn0gCAJEwAgCN+QMAgfUCACAAAICD9QIAgvUCAIV9AwCEFQMAh20DAIZtAwCJXQMAiF0DAIutAwCKrQMAjaEDAIy9AwCPoQMAjqkDAJHhAwCQ2QMAk+EDAJLpAwCV4QMAlPkDAJflAwCW5QMAmY0DAJiNAwCZAAAAmp0DAJ8AAACeAAAAnQAAAJwAAACjAAAAogAAAKEAAACgAAAApwAAAKYAAAClAAAApAAAAKsAAACqAAAAqQAAAKgAAACvAAAArgAAAK0AAACsAAAAswAAALIAAACxAAAAsAAAALcAAAC2AAAAtQAAALQAAAC7AAAAugAAALkAAAC4AAAAvwAAAL4AAAC9AAAAvAAAAMMAAADCAAAAwQAAAMAAAADHAAAAzAgBAMUAAADEAAAAywAAAMoAAADCiAEAwxQBAM8AAADOAAAAzQAAAMwAAADTAAAA0gAAANEAAADQAAAA1wAAANYAAADVAAAA1AAAANsAAADaAAAA2QAAANgAAADfAAAA3gAAAN0AAADcAAAA4wAAAOIAAADhAAAA4AAAAOcAAADmAAAA5QAAAO+sAQDrAAAA6gAAAOKcAQDj7AEA7wAAAO4AAADtAAAA7AAAAPMAAADyAAAA8QAAAPAAAAD3AAAA9gAAAPUAAAD0AAAA8GgAAPoAAAD5AAAA+AAAAP8AAAD+AAAA/QAAAPwAAAAgAC4uLgAwADEAMeKBhDIAMgAzADQANQA2ADcAOAA5ADorMToAQQBBzIoAQgBDAEQARQBGAEcASABJAEoASwBMAE0ATgBPAFAAUQBSAFMAVABVAFYAVwBYAFkAWgBhAGIAYwBkAGUAZgBmaQBnAGgAaQBqAGsAbABtAG4AbwBwAHEAcgBzAHQAdQB2AHcAeAB5AHoAw6kA4bixAA=="


def compile_charsmap():
    """RULES compiled by sentencepiece's trainer (normalization_rule_tsv):
    the model proto's normalizer_spec.precompiled_charsmap, read without protobuf."""
    import base64
    import io
    import tempfile
    import sentencepiece as spm
    with tempfile.NamedTemporaryFile("w", suffix=".tsv", delete=False) as f:
        f.write("".join(f"{a}\t{b}\n" for a, b in RULES))
    m = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["the quick brown fox jumps over the lazy dog"] * 50),
                                   model_writer=m, vocab_size=40, hard_vocab_limit=False, model_type="unigram",
                                   normalization_rule_tsv=f.name, character_coverage=1.0, minloglevel=2)
    os.unlink(f.name)

    def fields(b):  # protobuf wire format: (field number, bytes of a length-delimited field)
        i = 0
        while i < len(b):
            key, s = 0, 0
            while True:
                c = b[i]
                i, key, s = i + 1, key | (c & 0x7F) << s, s + 7
                if c < 0x80:
                    break
            wt = key & 7
            if wt == 0:
                while b[i] & 0x80:
                    i += 1
                i += 1
            elif wt == 1 or wt == 5:
                i += 8 if wt == 1 else 4
            elif wt == 2:
                n, s = 0, 0
                while True:
                    c = b[i]
                    i, n, s = i + 1, n | (c & 0x7F) << s, s + 7
                    if c < 0x80:
                        break
                yield key >> 3, b[i:i + n]
                i += n
    spec = next(v for k, v in fields(m.getvalue()) if k == 3)  # ModelProto.normalizer_spec
    return base64.b64encode(next(v for k, v in fields(spec) if k == 2)).decode()  # .precompiled_charsmap


def build(corpus_texts):
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pt.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tr = trainers.UnigramTrainer(vocab_size=650, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>",
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
    ap.add_argument("--cases", type=int, default=120)
    ap.add_argument("--charsmap", action="store_true", help="recompile the charsmap with sentencepiece")
    a = ap.parse_args()
    charsmap = compile_charsmap() if a.charsmap else CHARSMAP
    os.makedirs(a.out, exist_ok=True)
    t5 = build(comp.texts(random.Random(a.seed), 160))
    pre = Tokenizer.from_str(t5.to_str())
    pre.normalizer = normalizers.Sequence([normalizers.Precompiled(base64.b64decode(charsmap)),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    nmt = Tokenizer.from_str(t5.to_str())
    nmt.normalizer = normalizers.Sequence([normalizers.Nmt(), normalizers.NFKC(),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    for name, tok in [("unigram_t5", t5), ("unigram_bytes", with_bytes(t5)), ("unigram_precompiled", pre),
                      ("unigram_nmt", nmt)]:
        with open(os.path.join(a.out, name + ".json"), "w") as f:
            f.write(tok.to_str())
        unk = 0
        with open(os.path.join(a.out, name + ".jsonl"), "w") as f:
            extra = ["", " ", "\u2581x", "<unk>"]
            if name == "unigram_precompiled":
                extra += ["k\u0301 e\u0301 ke\u0301k \U0001f44d\U0001f3fd \U0001f44d x\u2026 \uff21\uff42\uff43\uff11 \ufb01ne \u00bd",
                          "\u00c5\u200b\u3000\t\u00a0k"]
            rt = random.Random(f"{a.seed}-{name}")
            texts = comp.texts(rt, a.cases)
            if name == "unigram_nmt":  # control characters Nmt drops or makes spaces (not NUL: C strings)
                ctl = [chr(c) for c in [1, 8, 9, 0xB, 0xC, 0xD, 0x1F, 0x7F, 0x85, 0x8F, 0x9F, 0x1680, 0x200B, 0x200F,
                                        0x2028, 0x2581, 0xFEFF, 0xFFFD]]
                for i in range(len(texts)):
                    k = rt.randrange(len(texts[i]) + 1)
                    texts[i] = texts[i][:k] + rt.choice(ctl) + rt.choice(ctl) + texts[i][k:]
            for t in texts + extra:
                ids = tok.encode(t, add_special_tokens=True).ids
                unk += ids.count(tok.token_to_id("<unk>"))
                f.write(json.dumps({"t": t, "s": 1, "ids": ids, "d": tok.decode(ids)}, ensure_ascii=False) + "\n")
        print(f"{name}: vocab {tok.get_vocab_size()}, {unk} <unk> ids")


if __name__ == "__main__":
    main()
