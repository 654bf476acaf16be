#!/usr/bin/env python3
"""transformers' outputs on the embedded demo model (tests/fixtures/demo_model),
the reference tests/test_demo_model.c and scripts/demo.sh check tpr against.

Loads the committed checkpoint with MiniMaxM2ForCausalLM.from_pretrained
(f32 compute: the bf16 weights widen exactly; eager attention), encodes the
prompts with the committed tokenizer.json through Hugging Face `tokenizers`,
and writes into the model directory

  reference.safetensors  tokens (i64 [T]) of prompt 0 and logits (f32 [T, V]), every position
  reference.json         per prompt: text, ids, greedy continuation ids (model.generate,
                         do_sample=False, stopping at eos <|im_end|>, at most --max-new tokens;
                         the EOS itself not listed), its text (decode, special tokens skipped),
                         whether it ended at EOS, and the smallest top-1/top-2 logit gap of
                         its steps; transformers' mean cross-entropy over the validation windows.

Usage: scripts/reference/.venv/bin/python scripts/reference/make_demo_reference.py \
           [--model tests/fixtures/demo_model] [--max-new 40]
"""
import argparse
import json
import os

import numpy as np
import tokenizers
import torch
import transformers
from safetensors.torch import save_file
from transformers import MiniMaxM2ForCausalLM

transformers.utils.logging.disable_progress_bar()

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PROMPTS = ["The meaning of life is", "A computer is", "Q: What do you call",
           "<|im_start|>user\nTell me a fortune about computers.<|im_end|>\n<|im_start|>assistant\n"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(REPO, "tests", "fixtures", "demo_model"))
    ap.add_argument("--max-new", type=int, default=40)
    ap.add_argument("--seq-len", type=int, default=256)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    tok = tokenizers.Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    eos = tok.token_to_id("<|im_end|>")
    model = MiniMaxM2ForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager").eval()
    out = {"transformers": transformers.__version__, "torch": torch.__version__,
           "tokenizers": tokenizers.__version__, "eos_id": eos, "max_new_tokens": a.max_new, "prompts": []}
    tensors = {}
    with torch.no_grad():
        for i, text in enumerate(PROMPTS):
            ids = tok.encode(text).ids
            x = torch.tensor([ids], dtype=torch.int64)
            g = model.generate(x, max_new_tokens=a.max_new, do_sample=False, num_beams=1, eos_token_id=eos,
                               pad_token_id=eos, use_cache=True, output_logits=True, return_dict_in_generate=True)
            gen = g.sequences[0, len(ids):].tolist()
            ended = bool(gen and gen[-1] == eos)
            if ended:
                gen = gen[:-1]
            top2 = torch.stack([s[0].float() for s in g.logits]).topk(2, dim=-1).values
            out["prompts"].append({"text": text, "ids": ids, "ids_csv": ",".join(map(str, ids)), "greedy": gen, "ended_at_eos": ended,
                                   "greedy_text": tok.decode(gen, skip_special_tokens=True),
                                   "min_top2_gap": float((top2[:, 0] - top2[:, 1]).min())})
            if i == 0:
                tensors["tokens"] = x[0].clone()
                tensors["logits"] = model(input_ids=x, use_cache=False).logits[0].float().contiguous()
        val = np.load(os.path.join(a.model, "val.npy")).astype(np.int64)
        T = a.seq_len
        nw = (len(val) - 1) // T
        ce = 0.0
        for w in range(nw):
            win = torch.from_numpy(val[w * T: w * T + T + 1])
            logits = model(input_ids=win[None, :T], use_cache=False).logits[0].double()
            ce += float(torch.nn.functional.cross_entropy(logits, win[1:], reduction="sum"))
        out["val"] = {"seq_len": T, "windows": nw, "tokens": nw * T, "loss": ce / (nw * T)}
    save_file(tensors, os.path.join(a.model, "reference.safetensors"))
    with open(os.path.join(a.model, "reference.json"), "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    for p in out["prompts"]:
        print(json.dumps({"prompt": p["text"], "greedy_text": p["greedy_text"], "gap": round(p["min_top2_gap"], 4)}))
    print("val loss (transformers):", out["val"])


if __name__ == "__main__":
    main()
