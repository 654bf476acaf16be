#!/usr/bin/env python3
"""Writes tests/fixtures/reference.safetensors with the reference writer
(safetensors.torch, as Hugging Face checkpoints are written) and
tests/fixtures/reference_safetensors.json with the f32 value of every element,
so test_safetensors can prove that tpr reads what the reference writes, and
that tpr_st_write produces the same bytes.

    pip install safetensors torch
    scripts/reference/make_safetensors_fixture.py [--out-dir tests/fixtures]

The FP8 weight follows the DeepSeek-V3 / MiniMax-M2 release convention:
`<name>_scale_inv` holds one f32 scale per 128 x 128 block, and the weight's
value is float(fp8) * scale_inv[r // 128][c // 128] (weight_dequant in
DeepSeek-V3's inference/kernel.py). Its shape (130, 6) leaves a partial row
block and a partial column block.
"""
import argparse
import json
import math
import os

import torch
from safetensors.torch import save_file

BLOCK = 128


def fp8_block_quantize(w):
    """(R, C) f32 -> (fp8 (R, C), scale_inv (ceil(R/128), ceil(C/128)) f32)."""
    rows, cols = w.shape
    sr, sc = math.ceil(rows / BLOCK), math.ceil(cols / BLOCK)
    scale = torch.empty(sr, sc, dtype=torch.float32)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            s = blk.abs().max().clamp(min=1e-12) / 448.0
            scale[i, j] = s
            q[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = (blk / s).to(torch.float8_e4m3fn)
    return q, scale


def fp8_block_dequantize(q, scale):
    rows, cols = q.shape
    s = scale.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    return q.to(torch.float32) * s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_out = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures"))
    ap.add_argument("--out-dir", default=default_out)
    args = ap.parse_args()
    torch.manual_seed(1234)

    # Values chosen to exercise rounding, subnormals, signed zeros and range ends.
    edge = torch.tensor([0.0, -0.0, 1.0, -2.5, 3.140625, 1e-3, 65504.0, -1e-7, 0.1, 1 / 3, 2.0**-14, 2.0**-24],
                        dtype=torch.float32)
    f8_codes = torch.arange(0, 256, 17, dtype=torch.uint8)  # 16 codes across both signs, no NaN
    f8_codes[f8_codes == 0x7F] = 0x7E
    f8_codes[f8_codes == 0xFF] = 0xFE
    w = torch.randn(130, 6) * torch.linspace(0.01, 3.0, 6)  # columns of different magnitude
    w[129] *= 50  # the one-row edge block gets its own, larger scale
    q, scale_inv = fp8_block_quantize(w)

    tensors = {
        "f32.matrix": torch.cat([edge, torch.randn(3)]).reshape(3, 5),
        "f32.scalar": torch.tensor(-3.5),
        "bf16.vector": torch.cat([edge, torch.randn(5)]).to(torch.bfloat16),
        "f16.cube": torch.cat([edge, torch.randn(12)]).reshape(2, 3, 4).to(torch.float16),
        "f8.codes": f8_codes.view(torch.float8_e4m3fn),
        "model.layers.0.mlp.up_proj.weight": q,
        "model.layers.0.mlp.up_proj.weight_scale_inv": scale_inv,
        "i32.ids": torch.tensor([0, -1, 2147483647, -2147483648], dtype=torch.int32),
        "i64.ids": torch.tensor([[1, -2], [2**40, -(2**53)]], dtype=torch.int64),
        "u8.bytes": torch.tensor([0, 1, 127, 128, 255], dtype=torch.uint8),
        "empty": torch.zeros(0, 4),
    }
    os.makedirs(args.out_dir, exist_ok=True)
    st_path = os.path.join(args.out_dir, "reference.safetensors")
    save_file(tensors, st_path, metadata={"format": "pt"})

    expect = {}
    for name, t in tensors.items():
        if name.endswith(".weight") and t.dtype == torch.float8_e4m3fn:
            values = fp8_block_dequantize(t, tensors[name + "_scale_inv"])
        elif t.dtype.is_floating_point:
            values = t.to(torch.float32)
        else:
            values = t.to(torch.int64)  # ints are compared exactly (i64 beyond 2^24 too)
        expect[name] = {
            "dtype": str(t.dtype).replace("torch.", ""),
            "shape": list(t.shape),
            "values": values.flatten().tolist(),
        }
    json_path = os.path.join(args.out_dir, "reference_safetensors.json")
    with open(json_path, "w") as f:
        json.dump({"metadata": {"format": "pt"}, "tensors": expect}, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {st_path} ({os.path.getsize(st_path)} bytes), {json_path} ({os.path.getsize(json_path)} bytes)")


if __name__ == "__main__":
    main()
