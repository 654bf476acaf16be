#!/usr/bin/env python3
"""The two halves of scripts/bench/vs_transformers.sh.

  vs_transformers.py torch --model DIR --prompt-len P --gen-len G --threads N [--runs R]
      (the reference venv's python) transformers' MiniMaxM2ForCausalLM from
      DIR in float32, eager attention, greedy generate of G + 1 tokens after
      a fixed random prompt of P tokens, as tpr bench model does; a forward
      pre/post hook times every forward: the first is the prefill (P
      tokens), the other G the decode. One short warm-up generate, then R
      timed ones; the best prefill and the best decode are kept. Prints one
      JSON line.

  vs_transformers.py report --results FILE [--json]
      (any python3) the table from the JSON lines the shell script gathered.
"""
import argparse
import json
import sys
import time


def run_torch(a):
    import torch
    import transformers
    from transformers import AutoConfig, MiniMaxM2ForCausalLM

    torch.set_num_threads(a.threads)
    cfg = AutoConfig.from_pretrained(a.model)
    V = cfg.vocab_size
    # the hub's default bos/eos ids lie outside a small random vocabulary
    cfg.bos_token_id = cfg.eos_token_id = cfg.pad_token_id = None
    t0 = time.perf_counter()
    model = MiniMaxM2ForCausalLM.from_pretrained(a.model, config=cfg, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    load_s = time.perf_counter() - t0
    ids = torch.randint(0, V, (1, a.prompt_len), generator=torch.Generator().manual_seed(a.seed))

    spans = []
    model.register_forward_pre_hook(lambda m, args: spans.append([time.perf_counter()]))
    model.register_forward_hook(lambda m, args, out: spans[-1].append(time.perf_counter()))

    def generate(new):
        spans.clear()
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, num_beams=1,
                                 use_cache=True, eos_token_id=None, pad_token_id=0)
        if out.shape[1] != a.prompt_len + new or len(spans) != new:
            sys.exit(f"vs_transformers.py: generate made {out.shape[1] - a.prompt_len} tokens in "
                     f"{len(spans)} forwards, want {new}")
        return [e - s for s, e in spans]

    generate(2)  # warm-up: lazy initialisation, first-touch of the weights
    runs = []
    for _ in range(a.runs):
        t = generate(a.gen_len + 1)
        runs.append({"prefill_s": t[0], "decode_s": sum(t[1:])})
    pre = min(r["prefill_s"] for r in runs)
    dec = min(r["decode_s"] for r in runs)
    print(json.dumps({
        "engine": "transformers", "threads": a.threads, "prompt_len": a.prompt_len, "gen_len": a.gen_len,
        "prefill_tok_s": a.prompt_len / pre, "decode_tok_s": a.gen_len / dec,
        "runs": [{"prefill_tok_s": a.prompt_len / r["prefill_s"], "decode_tok_s": a.gen_len / r["decode_s"]}
                 for r in runs],
        "load_s": load_s, "dtype": "float32", "attn_implementation": model.config._attn_implementation,
        "experts_implementation": getattr(model.config, "_experts_implementation", None),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }))


def report(a):
    rows = [json.loads(l) for l in open(a.results) if l.startswith("{")]
    meta = next(r for r in rows if r.get("engine") == "meta")
    hf = next((r for r in rows if r.get("engine") == "transformers"), None)
    tpr = [r for r in rows if r.get("engine") == "tpr"]

    def ratio(r, key):
        return r[key] / hf[key] if hf and hf[key] > 0 else None

    for r in tpr:
        r["prefill_vs_transformers"] = ratio(r, "prefill_tok_s")
        r["decode_vs_transformers"] = ratio(r, "decode_tok_s")
    if a.json:
        print(json.dumps({"bench": "vs_transformers", **{k: v for k, v in meta.items() if k != "engine"},
                          "selection": "best of the runs per engine (prefill and decode apart)",
                          "transformers": hf, "tpr": tpr}))
        return
    print(f"\n{meta['config']}: checkpoint bf16 (tpr make-checkpoint), prompt {meta['prompt_len']}, "
          f"gen {meta['gen_len']}, {meta['threads']} threads; best of {meta['runs']} runs each")
    head = ("engine", "prefill tok/s", "decode tok/s", "prefill vs hf", "decode vs hf")
    lines = [head]
    if hf:
        lines.append((f"transformers eager f32 ({hf['threads']} thr, experts {hf['experts_implementation']})",
                      f"{hf['prefill_tok_s']:.1f}", f"{hf['decode_tok_s']:.1f}", "1.00x", "1.00x"))
    for r in tpr:
        f = lambda x: f"{x:.2f}x" if x is not None else "-"
        lines.append((r["label"], f"{r['prefill_tok_s']:.1f}", f"{r['decode_tok_s']:.1f}",
                      f(r["prefill_vs_transformers"]), f(r["decode_vs_transformers"])))
    w = [max(len(l[c]) for l in lines) for c in range(len(head))]
    for j, l in enumerate(lines):
        print(" | ".join(x.ljust(w[c]) if c == 0 else x.rjust(w[c]) for c, x in enumerate(l)))
        if j == 0:
            print("-+-".join("-" * n for n in w))
    if hf:
        print(f"transformers {hf['versions']['transformers']}, torch {hf['versions']['torch']}; "
              "prefill = the first forward of generate, decode = the other forwards")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("torch")
    t.add_argument("--model", required=True)
    t.add_argument("--prompt-len", type=int, required=True)
    t.add_argument("--gen-len", type=int, required=True)
    t.add_argument("--threads", type=int, required=True)
    t.add_argument("--runs", type=int, default=2)
    t.add_argument("--seed", type=int, default=1)
    r = sub.add_parser("report")
    r.add_argument("--results", required=True)
    r.add_argument("--json", action="store_true")
    a = ap.parse_args()
    run_torch(a) if a.cmd == "torch" else report(a)


if __name__ == "__main__":
    main()
