#!/usr/bin/env python3
"""Streaming load for `tpr serve` (scripts/bench/serve.sh): C concurrent
clients, each sending R streamed completions one after another with
ignore_eos and stream_options.include_usage, so every request generates
exactly max_tokens. Python's standard library only.

    serve_client.py URL --clients C --requests R --prompt-words W --max-tokens G

Prints one JSON object: wall seconds from the first request to the last
[DONE], generated and prompt tokens (from the usage chunks), aggregate
generated tok/s, client-side time to first chunk (p50, p90), and the
server's own time-to-first-token and inter-token-latency histograms over the
run (/metrics before and after; p50/p90 interpolated within buckets the way
Prometheus' histogram_quantile does, and the exact means from _sum/_count).
"""
import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse

WORDS = ("the model reads a stream of tokens and the engine batches every request into one step "
         "while the server sends text back as it comes").split()


def metrics(host, port):
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def histogram(before, after, name):
    """Bucket deltas -> (p50, p90, mean, count) of the observations in between."""
    buckets = []
    for key, v in after.items():
        if key.startswith(name + "_bucket{le=\""):
            le = key[len(name) + 12:-2]
            buckets.append((float("inf") if le == "+Inf" else float(le), v - before.get(key, 0.0)))
    buckets.sort()
    count = after.get(name + "_count", 0) - before.get(name + "_count", 0)
    total = after.get(name + "_sum", 0) - before.get(name + "_sum", 0)

    def quantile(q):
        if count <= 0:
            return None
        rank, lo, prev = q * count, 0.0, 0.0
        for le, cum in buckets:
            if cum >= rank:
                if le == float("inf"):
                    return lo
                return lo + (le - lo) * (rank - prev) / max(cum - prev, 1e-12)
            lo, prev = le, cum
        return lo

    return {"p50": quantile(0.5), "p90": quantile(0.9), "mean": total / count if count > 0 else None,
            "count": int(count)}


def one_request(host, port, prompt, max_tokens, result):
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True, "stream_options": {"include_usage": True}})
    t0 = time.monotonic()
    c = http.client.HTTPConnection(host, port, timeout=600)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        result["error"] = f"HTTP {r.status}: {r.read()[:200]!r}"
        return
    first = None
    usage = None
    done = False
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            break
        chunk = json.loads(data)
        if first is None and chunk.get("choices"):
            first = time.monotonic() - t0
        if chunk.get("usage"):
            usage = chunk["usage"]
    c.close()
    if not done or usage is None:
        result["error"] = "stream ended without a usage chunk and [DONE]"
        return
    result.update(first_chunk_s=first, completion_tokens=usage["completion_tokens"],
                  prompt_tokens=usage["prompt_tokens"], end=time.monotonic())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=1, help="requests per client, one after another")
    ap.add_argument("--prompt-words", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    host, port = u.hostname, u.port
    rng = random.Random(a.seed)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(a.prompt_words)) for _ in range(a.clients * a.requests)]
    results = [dict() for _ in prompts]

    def client(i):
        for k in range(a.requests):
            j = i * a.requests + k
            one_request(host, port, prompts[j], a.max_tokens, results[j])

    before = metrics(host, port)
    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    after = metrics(host, port)
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        print(json.dumps({"errors": errors[:5], "failed": len(errors)}))
        sys.exit(1)
    gen = sum(r["completion_tokens"] for r in results)
    firsts = sorted(r["first_chunk_s"] for r in results if r["first_chunk_s"] is not None)
    print(json.dumps({
        "clients": a.clients, "requests": len(results), "max_tokens": a.max_tokens, "wall_s": wall,
        "generated_tokens": gen, "prompt_tokens": sum(r["prompt_tokens"] for r in results),
        "generated_tok_s": gen / wall,
        "client_first_chunk_p50_s": firsts[len(firsts) // 2] if firsts else None,
        "server_ttft": histogram(before, after, "tpr_time_to_first_token_seconds"),
        "server_itl": histogram(before, after, "tpr_inter_token_latency_seconds"),
    }))


if __name__ == "__main__":
    main()
