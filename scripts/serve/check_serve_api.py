#!/usr/bin/env python3
"""The OpenAI surface of a running `tpr serve`, checked against references
computed here from tpr's own forward pass (`tpr forward`: the logits of
every position) and by hand: Python's standard library only, so CI needs
nothing installed.

    check_serve_api.py URL --tpr BIN --model DIR --eos ID

- logprobs (completions and chat) equal the log-softmax of `tpr forward`'s
  logits at the generated tokens; the top tokens are the most likely ones;
- frequency / presence / repetition penalties: the greedy answer equals the
  one computed by hand, step by step, from `tpr forward`'s logits with the
  penalties applied as OpenAI / vLLM define them (control: without the
  penalties the hand computation gives another answer);
- logit_bias on the EOS token ends the answer at once; min_tokens holds it
  off for exactly that many tokens;
- n: choices of a greedy request equal the single answer; sampled choices
  with a seed are reproducible and differ from each other; streamed choices
  concatenate per index to the full answer's;
- echo, seeds (two unseeded sampled requests differ), max_tokens absent (up
  to the context), refused parameters (an OpenAI-shaped 400 naming the
  parameter), HTTP/1.0 streaming (close-delimited), Expect: 100-continue.

Prints one line per check; exits 1 if any fails.
"""
import argparse
import http.client
import json
import math
import os
import socket
import struct
import subprocess
import sys
import tempfile
import urllib.parse

FAILS = 0


def check(ok, what):
    global FAILS
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    FAILS += not ok


class Server:
    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port

    def request(self, path, body, timeout=120):
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data

    def post(self, path, body):
        status, data = self.request(path, body)
        return status, json.loads(data)

    def stream(self, path, body):
        status, data = self.request(path, dict(body, stream=True))
        lines = [l[6:] for l in data.decode().split("\n") if l.startswith("data: ")]
        assert status == 200 and lines and lines[-1] == "[DONE]", (status, data[-200:])
        return [json.loads(l) for l in lines[:-1]]


class Model:
    """tpr's own tools on the served checkpoint: forward logits, tokenize, detokenize."""

    def __init__(self, tpr, model):
        self.tpr, self.model = tpr, model
        self.tmp = tempfile.mkdtemp(prefix="tpr_api_check.")

    def run(self, *args):
        return subprocess.run([self.tpr, *args], check=True, capture_output=True, text=True).stdout.strip()

    def tokenize(self, text):
        return [int(x) for x in self.run("tokenize", "--model", self.model, "--text", text).split(",") if x]

    def detokenize(self, ids):
        out = subprocess.run([self.tpr, "detokenize", "--model", self.model, "--ids", ",".join(map(str, ids)),
                              "--skip-special"], check=True, capture_output=True).stdout
        return out[:-1].decode() if out.endswith(b"\n") else out.decode()

    def logits(self, ids):
        """(len(ids), vocab) rows of f32 logits: row t predicts token t + 1."""
        out = os.path.join(self.tmp, "logits.safetensors")
        self.run("forward", "--model", self.model, "--tokens", ",".join(map(str, ids)), "--out", out)
        with open(out, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            head = json.loads(f.read(n))
            t = head["logits"]
            assert t["dtype"] == "F32"
            rows, vocab = t["shape"]
            f.seek(8 + n + t["data_offsets"][0])
            flat = struct.unpack(f"<{rows * vocab}f", f.read(rows * vocab * 4))
        return [list(flat[r * vocab:(r + 1) * vocab]) for r in range(rows)]


def log_softmax(row):
    m = max(row)
    s = math.log(sum(math.exp(x - m) for x in row)) + m
    return [x - s for x in row]


def argmax(row):
    best = 0
    for i, x in enumerate(row):
        if x > row[best]:
            best = i
    return best


def greedy_ids(model, prompt, n, process=lambda row, gen: row):
    """Greedy decoding by hand: n tokens after prompt, each the argmax of
    process(logits of the last position, generated so far)."""
    gen = []
    for _ in range(n):
        row = model.logits(prompt + gen)[-1]
        gen.append(argmax(process(list(row), gen)))
    return gen


def penalize(prompt, fp, pp, rp):
    """OpenAI's frequency / presence penalties over the generated tokens,
    vLLM's repetition penalty over prompt and generated tokens."""
    def process(row, gen):
        for t in set(prompt + gen):
            row[t] = row[t] / rp if row[t] > 0 else row[t] * rp
        for t in set(gen):
            row[t] -= fp * gen.count(t) + pp
        return row
    return process


def check_logprobs(srv, model, name):
    prompt = model.tokenize("hello world, the model")
    gen = greedy_ids(model, prompt, 6)
    lps = [log_softmax(r) for r in model.logits(prompt + gen)[len(prompt) - 1:]]
    want = [lps[k][gen[k]] for k in range(6)]
    st, c = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 3,
                                         "ignore_eos": True})
    lp = c["choices"][0]["logprobs"] if st == 200 else None
    ok = lp is not None and len(lp["token_logprobs"]) == 6
    err = max(abs(a - b) for a, b in zip(lp["token_logprobs"], want)) if ok else float("nan")
    check(ok and err < 2e-3, f"completions logprobs = log-softmax of tpr forward at the tokens (max err {err:.2e})")
    if ok:
        tops_ok = True
        for k in range(6):
            best = sorted(lps[k], reverse=True)[:3]
            got = sorted(lp["top_logprobs"][k].values(), reverse=True)
            # The sampled token is among the top 3 (greedy), so 3 entries, fewer
            # when two tokens share a text (pieces of one character): each
            # is then still one of the 3 most likely.
            tops_ok &= (len(got) == 3 and all(abs(a - b) < 2e-3 for a, b in zip(got, best))) or \
                (len(got) < 3 and all(min(abs(g - b) for b in best) < 2e-3 for g in got))
        text, toks, offs = c["choices"][0]["text"], lp["tokens"], lp["text_offset"]
        # Tokens that are pieces of a character show U+FFFD alone; whole ones
        # concatenate to the text, and each starts at its text_offset.
        whole = all("\ufffd" not in t for t in toks)
        offsets_ok = offs[0] == 0 and offs == sorted(offs) and offs[-1] <= len(text)
        if whole:
            offsets_ok &= "".join(toks) == text and all(text[o:o + len(t)] == t for o, t in zip(offs, toks))
        check(tops_ok and offsets_ok, "completions top_logprobs: the 3 most likely per position; text_offset "
              + ("and tokens match the text" if whole else "ordered (the answer splits characters across tokens)"))
    chat_prompt_text = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    cp = model.tokenize(chat_prompt_text)
    cgen = greedy_ids(model, cp, 4)
    clps = [log_softmax(r) for r in model.logits(cp + cgen)[len(cp) - 1:]]
    st, r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4,
                                              "temperature": 0, "logprobs": True, "top_logprobs": 2,
                                              "ignore_eos": True})
    content = r["choices"][0]["logprobs"]["content"] if st == 200 and r["choices"][0]["logprobs"] else []
    ok = len(content) == 4
    err = max(abs(content[k]["logprob"] - clps[k][cgen[k]]) for k in range(4)) if ok else float("nan")
    tops = ok and all(len(e["top_logprobs"]) == 2 and
                      abs(e["top_logprobs"][0]["logprob"] - max(clps[k])) < 2e-3 and
                      e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"] and
                      list(e["token"].encode()) == e["bytes"] for k, e in enumerate(content))
    check(ok and err < 2e-3 and tops, f"chat logprobs + top_logprobs 2 = tpr forward's (max err {err:.2e})")
    # Streamed logprobs: every token's, once, in order.
    chunks = srv.stream("/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 1,
                                            "ignore_eos": True})
    streamed = [x for ch in chunks for x in (ch["choices"][0]["logprobs"] or {}).get("token_logprobs", [])]
    check(len(streamed) == 6 and max(abs(a - b) for a, b in zip(streamed, want)) < 2e-3,
          "streamed logprobs: each token's once, in order")


def check_penalties(srv, model):
    prompt = model.tokenize("the model tokens stream chat")
    n = 10
    plain = greedy_ids(model, prompt, n)
    # A negative frequency penalty makes the model repeat what it said (a
    # random checkpoint's logits are within a few hundredths of each other),
    # so the answer must differ from the plain one; the positive set checks
    # the signs.
    for fp, pp, rp, control in ((-1.0, 0.4, 1.3, True), (1.5, 0.7, 1.2, False)):
        want = greedy_ids(model, prompt, n, penalize(prompt, fp, pp, rp))
        st, c = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                                             "frequency_penalty": fp, "presence_penalty": pp,
                                             "repetition_penalty": rp})
        got = c["choices"][0]["text"] if st == 200 else c
        check(got == model.detokenize(want),
              f"penalties frequency {fp} presence {pp} repetition {rp}: the answer = the hand computation")
        if control:
            check(want != plain, "control: without those penalties the hand computation answers differently")
    st, c = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True})
    check(st == 200 and c["choices"][0]["text"] == model.detokenize(plain), "no penalties: plain greedy answer")


def check_bias_min_tokens(srv, eos):
    body = {"prompt": "hello world", "max_tokens": 20, "temperature": 0, "logit_bias": {str(eos): 100}}
    st, c = srv.post("/v1/completions", body)
    ok = st == 200 and c["usage"]["completion_tokens"] == 1 and c["choices"][0]["finish_reason"] == "stop"
    check(ok, f"logit_bias +100 on EOS ({eos}): ends after 1 token ({c.get('usage')})")
    st, c = srv.post("/v1/completions", dict(body, min_tokens=5))
    ok = st == 200 and c["usage"]["completion_tokens"] == 6 and c["choices"][0]["finish_reason"] == "stop"
    check(ok, f"min_tokens 5: EOS held off for 5 tokens, then taken ({c.get('usage')})")
    st, c = srv.post("/v1/completions", dict(body, logit_bias={str(eos): -100}, max_tokens=8, ignore_eos=False))
    check(st == 200 and c["usage"]["completion_tokens"] == 8, "logit_bias -100 on EOS: never ends early")


def check_n(srv):
    base = {"prompt": "hello world", "max_tokens": 8, "ignore_eos": True}
    st, one = srv.post("/v1/completions", dict(base, temperature=0))
    st3, three = srv.post("/v1/completions", dict(base, temperature=0, n=3))
    texts = [c["text"] for c in three["choices"]] if st3 == 200 else []
    check(st3 == 200 and texts == [one["choices"][0]["text"]] * 3 and
          [c["index"] for c in three["choices"]] == [0, 1, 2] and three["usage"]["completion_tokens"] == 24,
          "n 3 greedy: three choices equal to n 1, usage counts 24 tokens")
    sampled = dict(base, temperature=1.0, n=4, seed=1234)
    _, a = srv.post("/v1/completions", sampled)
    _, b = srv.post("/v1/completions", sampled)
    ta, tb = [c["text"] for c in a["choices"]], [c["text"] for c in b["choices"]]
    check(ta == tb and len(set(ta)) > 1, f"n 4 sampled, seed 1234: reproducible, choices differ ({len(set(ta))} distinct)")
    chunks = srv.stream("/v1/completions", sampled)
    by_index = ["", "", "", ""]
    for ch in chunks:
        for c in ch["choices"]:
            by_index[c["index"]] += c.get("text", "")
    check(by_index == ta, "n 4 streamed: each index's chunks concatenate to that choice")
    chunks = srv.stream("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                                 "n": 2, "temperature": 0, "ignore_eos": True})
    finishes = sorted(c["index"] for ch in chunks for c in ch["choices"] if c.get("finish_reason"))
    check(finishes == [0, 1], "chat n 2 streamed: each choice ends with its finish_reason")


def check_misc(srv, model):
    st, c = srv.post("/v1/completions", {"prompt": "hello world", "max_tokens": 5, "temperature": 0, "echo": True,
                                         "ignore_eos": True})
    _, plain = srv.post("/v1/completions", {"prompt": "hello world", "max_tokens": 5, "temperature": 0,
                                            "ignore_eos": True})
    check(st == 200 and c["choices"][0]["text"] == "hello world" + plain["choices"][0]["text"],
          "echo: the prompt, then the answer")
    body = {"prompt": "hello world", "max_tokens": 12, "temperature": 1.0, "ignore_eos": True}
    texts = {srv.post("/v1/completions", body)[1]["choices"][0]["text"] for _ in range(3)}
    check(len(texts) > 1, f"no seed: sampled answers differ ({len(texts)} distinct of 3)")
    seeded = {srv.post("/v1/completions", dict(body, seed=7))[1]["choices"][0]["text"] for _ in range(2)}
    check(len(seeded) == 1, "seed 7: the same answer twice")
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=30)
    conn.request("GET", "/v1/models")
    ctx = json.loads(conn.getresponse().read())["data"][0]["max_model_len"]
    conn.close()
    prompt = model.tokenize("hello world")
    st, c = srv.post("/v1/completions", {"prompt": prompt, "temperature": 0, "ignore_eos": True})
    check(st == 200 and c["usage"]["completion_tokens"] == ctx - len(prompt),
          f"max_tokens absent: up to the context ({ctx} - {len(prompt)} tokens)")


def check_refusals(srv):
    cases = [
        ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),  # a built-in template
        ("/v1/chat/completions", {"tool_choice": "auto"}, "tool_choice"),
        ("/v1/chat/completions", {"response_format": {"type": "yaml"}}, "response_format"),
        ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions"),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"echo": True}, "echo"),
        ("/v1/completions", {"suffix": "end"}, "suffix"),
        ("/v1/completions", {"best_of": 3}, "best_of"),
        ("/v1/completions", {"echo": True, "logprobs": 1}, "echo"),
        ("/v1/completions", {"some_new_param": 1}, "some_new_param"),
        ("/v1/completions", {"logprobs": 21}, "logprobs"),
        ("/v1/completions", {"n": 0}, "n"),
        ("/v1/completions", {"frequency_penalty": 3}, "frequency_penalty"),
        ("/v1/completions", {"logit_bias": {"abc": 1}}, "logit_bias"),
        ("/v1/completions", {"logit_bias": {"5": 101}}, "logit_bias"),
        ("/v1/completions", {"logit_bias": {"99999999": 1}}, None),
        ("/v1/completions", {"min_tokens": 9, "max_tokens": 3}, "min_tokens"),
        ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
        ("/v1/completions", {"stream_options": {"include_usage": True}}, "stream_options"),
    ]
    for path, extra, param in cases:
        body = dict({"messages": [{"role": "user", "content": "x"}]} if "chat" in path else {"prompt": "x"},
                    max_tokens=2)
        body.update(extra)
        st, r = srv.post(path, body)
        e = r.get("error", {}) if isinstance(r, dict) else {}
        ok = st == 400 and e.get("message") and (param is None or e.get("param") == param)
        check(ok, f"{path} {json.dumps(extra)[:60]} -> {st} param {e.get('param')}: {e.get('message', '')[:80]}")


def raw(srv, data, read_until_close=True, timeout=30):
    s = socket.create_connection((srv.host, srv.port), timeout=timeout)
    s.sendall(data)
    return read_answer(s, read_until_close)


def read_answer(s, read_until_close=True):
    """Reads s until the peer closes it (or, if not read_until_close, until the
    end of the header); closes it."""
    out = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        out += b
        if not read_until_close and b"\r\n\r\n" in out:
            break
    s.close()
    return out


def check_http(srv):
    body = json.dumps({"prompt": "hello", "max_tokens": 4, "temperature": 0, "stream": True}).encode()
    out = raw(srv, b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % len(body) + body)
    head, _, rest = out.partition(b"\r\n\r\n")
    check(b" 200 " in head.split(b"\r\n")[0] and b"chunked" not in head.lower() and rest.rstrip().endswith(b"[DONE]"),
          "HTTP/1.0 stream: no chunked encoding, the body ends at the close with [DONE]")
    s = socket.create_connection((srv.host, srv.port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
              b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body))
    interim = s.recv(100)
    s.sendall(body)
    final = read_answer(s)
    check(interim.startswith(b"HTTP/1.1 100 Continue") and b" 200 " in final.split(b"\r\n")[0],
          "Expect: 100-continue: 100 Continue, then the answer")
    out = raw(srv, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: something-else\r\nContent-Length: 2\r\n\r\n{}")
    check(out.startswith(b"HTTP/1.1 417"), "Expect: something-else -> 417")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--tpr", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--eos", type=int, required=True)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    srv, model = Server(a.url), Model(a.tpr, a.model)
    parts = {"logprobs": lambda: check_logprobs(srv, model, "logprobs"),
             "penalties": lambda: check_penalties(srv, model),
             "bias": lambda: check_bias_min_tokens(srv, a.eos),
             "n": lambda: check_n(srv),
             "misc": lambda: check_misc(srv, model),
             "refusals": lambda: check_refusals(srv),
             "http": lambda: check_http(srv)}
    for name, fn in parts.items():
        if a.only and name not in a.only.split(","):
            continue
        try:
            fn()
        except Exception as e:  # a crash in one part is a failure, the others still run
            check(False, f"{name}: {type(e).__name__}: {e}")
    print(f"check_serve_api: {FAILS} failure(s)")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
