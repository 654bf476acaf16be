"""Runs llama.cpp's convert_hf_to_gguf.py on a tpr random checkpoint.

    python llamacpp_convert.py LLAMA_CPP_DIR CHECKPOINT_DIR --outtype bf16 --outfile M.gguf

LLAMA_CPP_DIR is the llama.cpp source tree (the llama-cpp-python sdist's
vendor/llama.cpp); the remaining arguments go to convert_hf_to_gguf.py.

One change to the converter, made here in memory (its files are not
touched): the BPE pre-tokenizer is named "llama-bpe" instead of being
recognized from a hash of the tokenizer's output. The converter only knows
the hashes of published tokenizers, and the checkpoint's tokenizer is a test
fixture (tests/fixtures/demo_model: byte-level BPE with Llama 3's split
regex, which is what llama-bpe pre-tokenizes with). The benchmark feeds
token ids, never text, so the tokenizer only has to load.
"""
import runpy
import sys
from pathlib import Path

if len(sys.argv) < 3:
    sys.exit("usage: llamacpp_convert.py LLAMA_CPP_DIR CHECKPOINT_DIR [convert_hf_to_gguf.py options]")
llama = Path(sys.argv[1])
script = llama / "convert_hf_to_gguf.py"
if not script.is_file():
    sys.exit(f"llamacpp_convert.py: no {script}")
sys.path[:0] = [str(llama / "gguf-py"), str(llama)]
sys.argv = [str(script)] + sys.argv[2:]

import conversion.base as base  # noqa: E402  (after the path is set)

base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "llama-bpe"
runpy.run_path(str(script), run_name="__main__")
