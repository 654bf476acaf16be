#!/usr/bin/env python3
"""Corpus, tokenizer and token files of the embedded demo model.

Reads Debian's `fortunes` data files (BSD fortune(6) cookie files, one quote
per '%'-separated record; BSD licence, see /usr/share/doc/fortunes/copyright),
cleans them into plain English text, holds out 5% of the documents (a seeded
shuffle) for validation, trains a byte-level BPE tokenizer with Hugging Face
`tokenizers` on the training documents only, and writes

  OUT/tokenizer/tokenizer.json, tokenizer_config.json   (ChatML template, eos <|im_end|>)
  OUT/train.npy, OUT/val.npy                            (<u2 token ids, documents concatenated)
  OUT/stats.json                                        (documents, bytes, tokens per split)

Every document ends with <|im_end|> (the EOS, so `tpr run` stops after one
quote); a quarter of them are wrapped as a ChatML exchange
("<|im_start|>user\\nTell me a fortune about TOPIC.<|im_end|>\\n<|im_start|>assistant\\n" ...),
so the model answers `tpr serve`'s chat endpoint with a quote.

Usage: prepare_data.py [--src /usr/share/games/fortunes] [--out build/demo_data] [--vocab 4096] [--seed 20]
"""
import argparse
import json
import os
import random
import re

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

# Not English prose: pictures made of characters, and the file of foreign sayings.
SKIP = {"art", "ascii-art", "translate-me"}
TOPICS = {"songs-poems": "songs and poems", "men-women": "men and women", "knghtbrd": "knights",
          "linuxcookie": "Linux", "linux": "Linux", "debian": "Debian", "perl": "Perl", "startrek": "Star Trek",
          "tao": "the Tao", "zippy": "Zippy", "goedel": "logic", "paradoxum": "paradoxes",
          "fortunes": "the future", "cookie": "life", "miscellaneous": "anything", "pratchett": "Pratchett"}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def clean(record):
    """One fortune as plain text: overstrikes resolved, tabs expanded, no trailing blanks."""
    t = re.sub(r"_\x08(.)", r"\1", record)      # underline: _^H x -> x
    t = re.sub(r"(.)\x08\1", r"\1", t)          # bold: x^H x -> x
    t = re.sub(r".\x08", "", t)                 # any other overstrike keeps the last character
    t = t.expandtabs(4)
    lines = [re.sub(r" {5,}", "    ", ln.rstrip()) for ln in t.split("\n")]
    t = "\n".join(lines).strip("\n")
    if not t.strip() or re.search(r"[\x00-\x09\x0b-\x1f\x7f]", t):
        return None
    return t


def read_docs(src):
    docs = []
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if "." in name or name in SKIP or os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for rec in re.split(r"\n%\n", f.read()):
                t = clean(rec.rstrip("%\n"))
                if t and "\ufffd" not in t:
                    docs.append((name, t))
    return docs


def render(doc, chat):
    name, text = doc
    if chat:
        topic = TOPICS.get(name, name)
        return (f"<|im_start|>user\nTell me a fortune about {topic}.<|im_end|>\n<|im_start|>assistant\n"
                f"{text}<|im_end|>")
    return text + "<|im_end|>"


def train_tokenizer(texts, vocab):
    t = Tokenizer(models.BPE())
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t.train_from_iterator(texts, tr)
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default="/usr/share/games/fortunes")
    ap.add_argument("--out", default="build/demo_data")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--val-frac", type=float, default=0.05)
    a = ap.parse_args()
    docs = read_docs(a.src)
    r = random.Random(a.seed)
    r.shuffle(docs)
    chat = [r.random() < 0.25 for _ in docs]
    n_val = int(round(a.val_frac * len(docs)))
    split = {"val": list(zip(docs[:n_val], chat[:n_val])), "train": list(zip(docs[n_val:], chat[n_val:]))}
    texts = {k: [render(d, c) for d, c in v] for k, v in split.items()}
    # The tokenizer learns its merges from the training documents alone.
    # (special tokens cut out of the text: they are added whole, never merged into)
    special = re.compile("|".join(re.escape(s) for s in SPECIALS))
    tok = train_tokenizer([special.sub("\n", t) for t in texts["train"]], a.vocab)
    os.makedirs(os.path.join(a.out, "tokenizer"), exist_ok=True)
    tok.save(os.path.join(a.out, "tokenizer", "tokenizer.json"))
    with open(os.path.join(a.out, "tokenizer", "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "model_max_length": 1024, "tokenizer_class": "PreTrainedTokenizerFast",
                   "chat_template": CHATML}, f, indent=1)
        f.write("\n")
    stats = {"source": "Debian package fortunes, " + a.src, "vocab_size": tok.get_vocab_size(), "seed": a.seed}
    for k, ts in texts.items():
        ids = []
        for e in tok.encode_batch(ts):
            ids.extend(e.ids)
        arr = np.asarray(ids, dtype="<u2")
        np.save(os.path.join(a.out, f"{k}.npy"), arr)
        stats[k] = {"documents": len(ts), "chat_documents": sum(c for _, c in split[k]),
                    "bytes": sum(len(t.encode()) for t in ts), "tokens": int(arr.size)}
    with open(os.path.join(a.out, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
        f.write("\n")
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
