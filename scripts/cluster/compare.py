#!/usr/bin/env python3
"""Comparisons for the cluster test (Python standard library only).

  compare.py params A.safetensors B.safetensors [--tol X]
      every tensor of B must be in A with the same dtype and shape, and
      max|a-b| / max|b| <= X (default 1e-6) per tensor; prints the worst and
      how many tensors are bit-identical. Exit 1 if any differs past X.
  compare.py losses A.jsonl B.jsonl [--tol X]
      the "loss" of every step line of `tpr train --json` (lines with a
      "step"), |a-b| / |b| <= X (default 1e-6), same number of steps.
  compare.py bytes FILE [--exclude REGEX]
      bytes of the tensors whose names do not match REGEX (a lower bound on
      gradient bytes a data-parallel step must exchange for them).
"""
import json
import math
import re
import struct
import sys

FORMATS = {"F32": ("f", 4), "F64": ("d", 8), "F16": ("e", 2), "I32": ("i", 4), "I64": ("q", 8)}


def read_st(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        sys.exit(f"compare.py: {path}: {len(blob)} bytes, not a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        sys.exit(f"compare.py: {path}: header of {n} bytes past the end of the file ({len(blob)})")
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    return header, blob[8 + n:]


def values(entry, data, name, path):
    dtype = entry["dtype"]
    start, end = entry["data_offsets"]
    raw = data[start:end]
    if dtype == "BF16":  # the high half of an f32
        count = len(raw) // 2
        halves = struct.unpack(f"<{count}H", raw)
        return struct.unpack(f"<{count}f", struct.pack(f"<{count}I", *[h << 16 for h in halves]))
    if dtype not in FORMATS:
        sys.exit(f"compare.py: {path}: {name}: dtype {dtype} not supported")
    code, size = FORMATS[dtype]
    return struct.unpack(f"<{len(raw) // size}{code}", raw)


def params(a_path, b_path, tol):
    a, a_data = read_st(a_path)
    b, b_data = read_st(b_path)
    worst, worst_name, identical, bad = 0.0, "", 0, []
    for name in sorted(b):
        if name not in a:
            bad.append(f"{name}: missing from {a_path}")
            continue
        if a[name]["dtype"] != b[name]["dtype"] or a[name]["shape"] != b[name]["shape"]:
            bad.append(f"{name}: {a[name]['dtype']}{a[name]['shape']} vs {b[name]['dtype']}{b[name]['shape']}")
            continue
        if a_data[slice(*a[name]["data_offsets"])] == b_data[slice(*b[name]["data_offsets"])]:
            identical += 1
            continue
        va, vb = values(a[name], a_data, name, a_path), values(b[name], b_data, name, b_path)
        diff = max((abs(x - y) if not (math.isnan(x) or math.isnan(y)) else math.inf for x, y in zip(va, vb)), default=0)
        scale = max((abs(y) for y in vb), default=0)
        rel = diff / scale if scale > 0 else diff
        if rel > worst:
            worst, worst_name = rel, name
    print(f"params: {len(b)} tensors, {identical} bit-identical, worst max|a-b|/max|b| {worst:.3e}"
          f"{' (' + worst_name + ')' if worst_name else ''}, bound {tol:g}")
    for line in bad:
        print(f"params: {line}")
    return 0 if worst <= tol and not bad else 1


def step_losses(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            j = json.loads(line)
            if "step" in j and "loss" in j:
                out.append(j["loss"])
    return out


def losses(a_path, b_path, tol):
    a, b = step_losses(a_path), step_losses(b_path)
    if not b or len(a) != len(b):
        print(f"losses: {len(a)} steps in {a_path}, {len(b)} in {b_path}")
        return 1
    rels = [abs(x - y) / abs(y) if y else abs(x - y) for x, y in zip(a, b)]
    worst = max(rels)
    print(f"losses: {len(b)} steps, worst |a-b|/|b| {worst:.3e} (step {rels.index(worst)}), bound {tol:g}; "
          f"a {' '.join(f'{x:.9g}' for x in a)}; b {' '.join(f'{y:.9g}' for y in b)}")
    return 0 if worst <= tol else 1


def nbytes(path, exclude):
    header, _ = read_st(path)
    rx = re.compile(exclude) if exclude else None
    total = sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if not (rx and rx.search(k)))
    print(total)
    return 0


def main(argv):
    opts = {"--tol": "1e-6", "--exclude": ""}
    pos = []
    i = 0
    while i < len(argv):
        if argv[i] in opts and i + 1 < len(argv):
            opts[argv[i]] = argv[i + 1]
            i += 2
        else:
            pos.append(argv[i])
            i += 1
    if len(pos) == 3 and pos[0] == "params":
        return params(pos[1], pos[2], float(opts["--tol"]))
    if len(pos) == 3 and pos[0] == "losses":
        return losses(pos[1], pos[2], float(opts["--tol"]))
    if len(pos) == 2 and pos[0] == "bytes":
        return nbytes(pos[1], opts["--exclude"])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
