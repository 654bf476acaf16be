#!/usr/bin/env python3
"""Points the official `openai` Python client at a running `tpr serve` and
checks what an application relies on: the model list, a completion, a chat
completion, both streamed and not, streamed text equal to the whole answer,
usage counts, logprobs and n choices parsed into the client's types, a
stream the application abandons halfway, and OpenAI-shaped errors (an
unknown model, tools and schema keywords the server does not have, an
unknown parameter) surfacing as the client's own exception types.

    scripts/reference/.venv/bin/python scripts/reference/check_openai_client.py http://127.0.0.1:PORT \
        [--tools | --trained-tools docs/examples/weather_tools.json]

With --tools (a server whose chat template renders tools, with the hermes
tool-call parser and the think reasoning parser on, as test_serve's second
server): a request with tools, streamed and not, parsed into the client's
types with reasoning_content; tool_choice "required" answered with the call
its grammar forces, streamed and not; response_format json_schema; and, because a
tiny random model never emits a tool call, scripted responses in the exact
shape tpr serve writes (test_serve_units checks tpr's side of that shape)
read back by the client: message.tool_calls, and delta.tool_calls
accumulated by the client's own stream state into the same calls.

With --trained-tools TOOLS.json (a server of a model fine-tuned to call
tools, as docs/fine-tune.md's tool walkthrough makes one): the model's own
tool call read by the client, not streamed and streamed (the client's stream
state accumulating delta.tool_calls into the same call), and the follow-up
turn sent back the way applications send it (the client's assistant message
and a tool result) answered.

Prints one line per check; exits 1 if any fails.
"""
import json
import sys

import openai
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk


def check_tools(client, check):
    model = client.models.list().data[0].id
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "the weather",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    r = client.chat.completions.create(model=model, messages=msgs, tools=tools, max_tokens=8, temperature=0)
    m = r.choices[0].message
    reasoning = getattr(m, "reasoning_content", None)
    check(isinstance(reasoning, str) and m.tool_calls is None and r.choices[0].finish_reason in ("stop", "length"),
          f"tools: a chat answer with reasoning_content ({len(reasoning or '')} chars), no tool call")
    parts = []
    for ch in client.chat.completions.create(model=model, messages=msgs, tools=tools, max_tokens=8, temperature=0,
                                             stream=True):
        if ch.choices:
            parts.append(getattr(ch.choices[0].delta, "reasoning_content", None) or "")
    check("".join(parts) == reasoning, "tools, streamed: delta.reasoning_content concatenates to reasoning_content")
    # tool_choice "required": the answer is decoded under the call's grammar, even from a random model
    # (whose strings can run on past any max_tokens: the city has a maxLength).
    tools = [{"type": "function", "function": dict(tools[0]["function"], parameters={
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}})}]
    forced = client.chat.completions.create(model=model, messages=msgs, tools=tools, tool_choice="required",
                                            max_tokens=1000, temperature=1, seed=3)
    fc = forced.choices[0]
    fcalls = fc.message.tool_calls or []
    check(fc.finish_reason == "tool_calls" and len(fcalls) == 1 and fcalls[0].function.name == "get_weather"
          and isinstance(json.loads(fcalls[0].function.arguments), dict),
          f"tool_choice required: the model's forced call {fcalls[0].function.arguments if fcalls else None}")
    state = ChatCompletionStreamState()
    for ch in client.chat.completions.create(model=model, messages=msgs, tools=tools, tool_choice="required",
                                             max_tokens=1000, temperature=1, seed=3, stream=True):
        state.handle_chunk(ch)
    sc = state.get_final_completion().choices[0].message.tool_calls or []
    check(len(sc) == 1 and fcalls and sc[0].function.arguments == fcalls[0].function.arguments,
          "tool_choice required, streamed: the same call")
    j = client.chat.completions.create(model=model, messages=msgs, max_tokens=1000, temperature=1, seed=4,
                                       response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": {
                                           "type": "object", "properties": {"n": {"type": "integer"}},
                                           "required": ["n"]}}})
    try:
        ok = isinstance(json.loads(j.choices[0].message.content)["n"], int)
    except (ValueError, KeyError, TypeError):
        ok = False
    check(ok and j.choices[0].finish_reason == "stop", f"response_format json_schema: {j.choices[0].message.content!r}")

    # Scripted: what tpr serve writes for an answer "<think>plan</think>\n<tool_call>...</tool_call>" x2.
    env = {"id": "chatcmpl-1", "created": 1, "model": model}
    calls = [{"id": "call_0123456789abcdef01234567", "type": "function",
              "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
             {"id": "call_89abcdef0123456789abcdef", "type": "function",
              "function": {"name": "get_weather", "arguments": "{\"city\":\"日本\"}"}}]
    full = ChatCompletion.model_validate(dict(env, object="chat.completion", choices=[{
        "index": 0, "message": {"role": "assistant", "content": None, "reasoning_content": "plan",
                                "tool_calls": calls},
        "logprobs": None, "finish_reason": "tool_calls"}],
        usage={"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}))
    fm = full.choices[0].message
    check(fm.content is None and fm.reasoning_content == "plan" and len(fm.tool_calls) == 2 and
          json.loads(fm.tool_calls[1].function.arguments) == {"city": "日本"} and
          full.choices[0].finish_reason == "tool_calls", "scripted: message.tool_calls and reasoning_content parsed")
    chunks = [{"role": "assistant"}, {"reasoning_content": "pl"}, {"reasoning_content": "an"}, {"content": "\n"}]
    chunks += [{"tool_calls": [dict(c, index=i)]} for i, c in enumerate(calls)]
    state = ChatCompletionStreamState(input_tools=tools)
    for k, d in enumerate(chunks + [{}]):
        state.handle_chunk(ChatCompletionChunk.model_validate(dict(env, object="chat.completion.chunk", choices=[{
            "index": 0, "delta": d, "logprobs": None, "finish_reason": "tool_calls" if k == len(chunks) else None}])))
    sm = state.get_final_completion().choices[0].message
    check([(c.id, c.function.name, c.function.arguments) for c in sm.tool_calls] ==
          [(c.id, c.function.name, c.function.arguments) for c in fm.tool_calls] and sm.content == "\n",
          "scripted stream: delta.tool_calls (whole calls with their index) accumulate to the same calls")


def check_trained_tools(client, check, tools_path):
    model = client.models.list().data[0].id
    with open(tools_path, encoding="utf-8") as f:
        tools = json.load(f)
    msgs = [{"role": "user", "content": "What is the weather in Lima?"}]
    r = client.chat.completions.create(model=model, messages=msgs, tools=tools, max_tokens=64, temperature=0)
    m, fin = r.choices[0].message, r.choices[0].finish_reason
    calls = m.tool_calls or []
    args = json.loads(calls[0].function.arguments) if calls else None
    check(fin == "tool_calls" and m.content is None and len(calls) == 1 and calls[0].function.name == "get_weather"
          and calls[0].id.startswith("call_") and isinstance(args, dict) and isinstance(args.get("city"), str),
          f"the model's tool call: {calls[0].function.name if calls else None}({args}), finish {fin}")
    state = ChatCompletionStreamState()
    for ch in client.chat.completions.create(model=model, messages=msgs, tools=tools, max_tokens=64, temperature=0,
                                             stream=True):
        state.handle_chunk(ch)
    s = state.get_final_completion().choices[0]
    sc = s.message.tool_calls or []
    check(s.finish_reason == "tool_calls" and len(sc) == 1 and calls and sc[0].function.name == calls[0].function.name
          and sc[0].function.arguments == calls[0].function.arguments,
          "streamed: the client's stream state accumulates the same call")
    follow = msgs + [m.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": calls[0].id if calls else "x", "content": '{"temp": 18}'}]
    f2 = client.chat.completions.create(model=model, messages=follow, tools=tools, max_tokens=16, temperature=0)
    check(f2.choices[0].finish_reason in ("stop", "length", "tool_calls") and f2.usage.prompt_tokens > r.usage.prompt_tokens,
          f"the follow-up turn (the client's assistant message with its tool call, a tool result): "
          f"{f2.usage.prompt_tokens} prompt tokens, finish {f2.choices[0].finish_reason}")


def main():
    base = sys.argv[1].rstrip("/") + "/v1"
    if "--trained-tools" in sys.argv[2:]:
        fails = 0

        def check(ok, what):
            nonlocal fails
            print(("ok: " if ok else "FAIL: ") + what)
            fails += not ok

        check_trained_tools(openai.OpenAI(base_url=base, api_key="unused"), check,
                            sys.argv[sys.argv.index("--trained-tools") + 1])
        print(f"openai {openai.__version__}: {fails} failure(s)")
        sys.exit(1 if fails else 0)
    if "--tools" in sys.argv[2:]:
        fails = 0

        def check(ok, what):
            nonlocal fails
            print(("ok: " if ok else "FAIL: ") + what)
            fails += not ok

        check_tools(openai.OpenAI(base_url=base, api_key="unused"), check)
        print(f"openai {openai.__version__}: {fails} failure(s)")
        sys.exit(1 if fails else 0)
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
            model=model, messages=msgs, max_tokens=2, response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "string", "pattern": "a+"}}})),
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
