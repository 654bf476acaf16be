#!/usr/bin/env python3
"""Writes tests/fixtures/data_prepare/: small random inputs for `tpr data
prepare` and the ids (and chat loss masks) Hugging Face `tokenizers` and
jinja2 give for them with the demo model's tokenizer, for test_data_prepare.

    scripts/reference/.venv/bin/python scripts/reference/make_data_prepare_fixture.py \
        [--out tests/fixtures/data_prepare] [--seed 32]

Files:
  input.txt    documents separated by one or more blank lines (the text's own
               blank lines removed, so each document is exactly what the
               generator made)
  input.jsonl  {"text": ...} per line (some lines with \\uXXXX escapes, some
               with an extra key), blank lines between some
  chat.jsonl   {"messages": [...]}: a system message or not, 1-3 user /
               assistant turns
  expected.json  {"txt": [[ids]...], "jsonl": [[ids]...],
                  "chat": [{"ids": [...], "mask": [...]}...]}

The ids are Tokenizer.encode(text, add_special_tokens=False). A chat is
rendered with jinja2 from the template text in the demo model's
tokenizer_config.json (as transformers' apply_chat_template does); assistant
message i's reply is the suffix by which messages[:i+1] rendered without the
generation prompt extends messages[:i] rendered with it, and a token's mask is
1 when the token's character offsets (from `tokenizers`) lie inside a reply:
a check independent of tpr's built-in template and of how tpr places the mask.
"""
import argparse
import json
import os
import random
import sys

import jinja2
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_fixture import rand_text  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DEMO = os.path.join(ROOT, "tests", "fixtures", "demo_model")
ASCII_WS = " \t\r\n\f\v"  # what tpr data prepare counts as a blank line's bytes


def clean_doc(text):
    """A document as tpr's blank-line splitting gives it back: no blank lines
    inside, none at the ends, no carriage returns (a final \\r\\n is dropped)."""
    lines = [ln for ln in text.replace("\r", " ").split("\n") if any(c not in ASCII_WS for c in ln)]
    return "\n".join(lines)


def render(template, messages, gen):
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=gen)


def chat_case(tok, template, messages):
    whole = render(template, messages, False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render(template, messages[:i], True)
        after = render(template, messages[: i + 1], False)
        assert after.startswith(before) and whole.startswith(after)
        spans.append((len(before), len(after)))
    enc = tok.encode(whole, add_special_tokens=False)
    mask = []
    for a, b in enc.offsets:
        inside = any(s <= a and b <= e for s, e in spans)
        straddles = any(a < s < b or a < e < b for s, e in spans)
        assert not straddles, (whole, a, b)
        mask.append(1 if inside else 0)
    return {"ids": enc.ids, "mask": mask}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "data_prepare"))
    ap.add_argument("--seed", type=int, default=32)
    args = ap.parse_args()
    r = random.Random(args.seed)
    tok = Tokenizer.from_file(os.path.join(DEMO, "tokenizer.json"))
    template = json.load(open(os.path.join(DEMO, "tokenizer_config.json")))["chat_template"]
    os.makedirs(args.out, exist_ok=True)

    docs = []
    while len(docs) < 40:
        d = clean_doc(rand_text(r, None, 24) + "\n" + rand_text(r, None, 10) if r.random() < 0.4 else
                      rand_text(r, None, 24))
        if d:
            docs.append(d)
    with open(os.path.join(args.out, "input.txt"), "w", encoding="utf-8", newline="") as f:
        for i, d in enumerate(docs):
            f.write(d + "\n")
            if i + 1 < len(docs):
                f.write(r.choice(["\n", "\n\n", " \n", "\t\n\n", "\r\n"]))

    texts = [rand_text(r, None, 24) for _ in range(40)]
    with open(os.path.join(args.out, "input.jsonl"), "w", encoding="utf-8", newline="") as f:
        for t in texts:
            obj = {"id": r.randint(0, 10**6), "text": t} if r.random() < 0.3 else {"text": t}
            f.write(json.dumps(obj, ensure_ascii=r.random() < 0.5) + "\n")
            if r.random() < 0.1:
                f.write("\n")

    def content():
        return rand_text(r, None, 12).lstrip(ASCII_WS + "\u3000\u00a0") or "ok"

    chats = []
    for _ in range(24):
        msgs = []
        if r.random() < 0.5:
            msgs.append({"role": "system", "content": content()})
        for _ in range(r.randint(1, 3)):
            msgs.append({"role": "user", "content": content()})
            msgs.append({"role": "assistant", "content": content()})
        chats.append(msgs)
    with open(os.path.join(args.out, "chat.jsonl"), "w", encoding="utf-8", newline="") as f:
        for m in chats:
            f.write(json.dumps({"messages": m}, ensure_ascii=False) + "\n")

    expected = {
        "txt": [tok.encode(d, add_special_tokens=False).ids for d in docs],
        "jsonl": [tok.encode(t, add_special_tokens=False).ids for t in texts],
        "chat": [chat_case(tok, template, m) for m in chats],
    }
    with open(os.path.join(args.out, "expected.json"), "w") as f:
        json.dump(expected, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
