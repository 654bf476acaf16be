#!/usr/bin/env python3
"""Points the official `openai` Python client at a running `tpr serve` and
checks what an application relies on: the model list, a completion, a chat
completion, both streamed and not, streamed text equal to the whole answer,
usage counts, logprobs and n choices parsed into the client's types, a
stream the application abandons halfway, and OpenAI-shaped errors (an
unknown model, tools and response formats the server does not have, an
unknown parameter) surfacing as the client's own exception types.

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

    lp = client.chat.completions.create(model=model, messages=msgs, max_tokens=4, temperature=0, logprobs=True,
                                        top_logprobs=3).choices[0].logprobs
    check(lp is not None and len(lp.content) >= 1 and all(len(t.top_logprobs) == 3 and t.logprob <= 0
                                                           for t in lp.content),
          f"chat logprobs: {len(lp.content) if lp else 0} tokens, 3 top_logprobs each")
    c = client.completions.create(model=model, prompt="hello world", max_tokens=4, temperature=0, logprobs=2)
    check(c.choices[0].logprobs is not None and len(c.choices[0].logprobs.token_logprobs) == c.usage.completion_tokens,
          "completions logprobs: one per token")
    n3 = client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0.9, n=3, seed=11)
    check([ch.index for ch in n3.choices] == [0, 1, 2], f"n=3: {len(n3.choices)} choices")
    again = client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0.9, n=3, seed=11)
    check([ch.message.content for ch in n3.choices] == [ch.message.content for ch in again.choices],
          "seed 11: the same n=3 answers twice")
    # An application that stops reading a stream halfway and closes it.
    stream = client.completions.create(model=model, prompt="hello world", max_tokens=200, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    for k, _ in enumerate(stream):
        if k == 2:
            break
    stream.close()
    again = client.completions.create(model=model, prompt="hello world", max_tokens=12, temperature=0)
    check(again.choices[0].text == text, "a stream closed halfway; the next request answers as before")

    refusals = [
        ("tools", lambda: client.chat.completions.create(
            model=model, messages=msgs, max_tokens=2,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])),
        ("response_format", lambda: client.chat.completions.create(
            model=model, messages=msgs, max_tokens=2, response_format={"type": "json_object"})),
        ("frobnicate", lambda: client.completions.create(model=model, prompt="x", max_tokens=2,
                                                         extra_body={"frobnicate": 1})),
    ]
    for param, call in refusals:
        try:
            call()
            check(False, f"{param} raises")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and param in str(e), f"{param} -> openai.BadRequestError naming it")
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
