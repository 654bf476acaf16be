#!/usr/bin/env python3
"""Points the official `openai` Python client at a running `tpr serve` and
checks what an application relies on: the model list, a completion, a chat
completion, both streamed and not, streamed text equal to the whole answer,
usage counts, and an OpenAI-shaped error surfacing as the client's own
exception type.

    scripts/reference/.venv/bin/python scripts/reference/check_openai_client.py http://127.0.0.1:PORT

Prints one line per check; exits 1 if any fails.
"""
import sys

import openai


def main():
    base = sys.argv[1].rstrip("/") + "/v1"
    client = openai.OpenAI(base_url=base, api_key="unused")
    fails = 0

    def check(ok, what):
        nonlocal fails
        print(("ok: " if ok else "FAIL: ") + what)
        fails += not ok

    models = client.models.list()
    model = models.data[0].id
    check(len(models.data) == 1, f"models.list -> {model}")

    c = client.completions.create(model=model, prompt="hello world", max_tokens=12, temperature=0)
    text = c.choices[0].text
    check(c.usage.completion_tokens >= 1 and c.choices[0].finish_reason in ("stop", "length"),
          f"completions.create: {c.usage.completion_tokens} tokens, finish {c.choices[0].finish_reason}")
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(
        model=model, prompt="hello world", max_tokens=12, temperature=0, stream=True) if ch.choices)
    check(streamed == text, "completions stream concatenates to the completion")

    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0)
    answer = r.choices[0].message.content
    check(r.choices[0].message.role == "assistant" and r.object == "chat.completion",
          f"chat.completions.create: {r.usage.prompt_tokens} prompt tokens")
    parts = []
    usage = None
    for ch in client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0, stream=True,
                                             stream_options={"include_usage": True}):
        if ch.choices and ch.choices[0].delta.content:
            parts.append(ch.choices[0].delta.content)
        if ch.usage:
            usage = ch.usage
    check("".join(parts) == answer, "chat stream concatenates to the chat answer")
    check(usage is not None and usage.completion_tokens == r.usage.completion_tokens,
          "stream_options.include_usage: the last chunk's usage equals the answer's")

    try:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
        check(False, "unknown model raises")
    except openai.NotFoundError as e:
        check(e.status_code == 404, f"unknown model -> openai.NotFoundError ({e.status_code})")
    try:
        client.completions.create(model=model, prompt="x", max_tokens=0)
        check(False, "max_tokens 0 raises")
    except openai.BadRequestError as e:
        check(e.status_code == 400, f"max_tokens 0 -> openai.BadRequestError ({e.status_code})")
    print(f"openai {openai.__version__}: {fails} failure(s)")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
