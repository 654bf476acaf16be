#!/usr/bin/env python3
"""Checks that every #include between tpr's folders points downward.

The order is scripts/layers.txt (lowest first; folders on one line are
peers). A file in folder A may include a header of A itself or of a folder
on a lower line; an include of a peer or of a higher folder is an error, and
so is a folder holding sources that the order does not list. Includes are
resolved as the compiler does: first beside the including file, then from
the repository root (the only include directory); headers found in neither
(system, generated) are not tpr's and are skipped.

  check_layers.py [--root DIR] [--layers FILE]   check a tree (exit 1 on errors)
  check_layers.py --self-test                     the check's own controls
"""
import argparse
import os
import re
import sys
import tempfile

SOURCE_EXT = (".c", ".h", ".cu", ".cuh")
SKIP_TOP = {"tests", "scripts", "cmake", "docs", "configs"}  # tests may include any layer
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read_layers(path):
    rank = {}  # folder -> (line index, line text)
    for line in open(path):
        line = line.split("#", 1)[0].split()
        if not line:
            continue
        level = len({r for r, _ in rank.values()})
        for folder in line:
            if folder in rank:
                raise SystemExit(f"check_layers: {path}: {folder} listed twice")
            rank[folder] = (level, " ".join(line))
    return rank


def source_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        top = rel.split(os.sep)[0]
        if rel != "." and (top in SKIP_TOP or top.startswith(("build", "."))):
            dirnames[:] = []
            continue
        for f in sorted(filenames):
            if f.endswith(SOURCE_EXT):
                yield os.path.normpath(os.path.join(rel, f))
        dirnames.sort()


def layer_of(relpath, rank):
    """The deepest listed folder containing relpath, or None."""
    d = os.path.dirname(relpath)
    while d:
        if d in rank:
            return d
        d = os.path.dirname(d)
    return None


def resolve(root, including, target):
    beside = os.path.normpath(os.path.join(os.path.dirname(including), target))
    if os.path.isfile(os.path.join(root, beside)):
        return beside
    if os.path.isfile(os.path.join(root, target)):
        return os.path.normpath(target)
    return None


def check(root, layers_path):
    rank = read_layers(layers_path)
    errors, edges = [], set()
    unlisted = set()
    for f in source_files(root):
        src = layer_of(f, rank)
        if src is None:
            if os.path.dirname(f):
                unlisted.add(os.path.dirname(f))
            continue
        text = open(os.path.join(root, f), errors="replace").read()
        for m in INCLUDE.finditer(text):
            lineno = text.count("\n", 0, m.start()) + 1
            hdr = resolve(root, f, m.group(1))
            if hdr is None:
                continue
            dst = layer_of(hdr, rank)
            if dst is None or dst == src:
                continue
            edges.add((src, dst))
            if rank[dst][0] == rank[src][0]:
                errors.append(f"{f}:{lineno}: includes {hdr}: {dst} is a peer of {src} ({rank[src][1]})")
            elif rank[dst][0] > rank[src][0]:
                errors.append(f"{f}:{lineno}: includes {hdr}: {dst} is above {src}")
    for d in sorted(unlisted):
        errors.append(f"{d}/: holds sources but is not in {os.path.relpath(layers_path, root)}")
    return errors, edges


def self_test():
    """Controls: a clean tree passes; upward, peer and unlisted ones fail."""
    def tree(files):
        root = tempfile.mkdtemp(prefix="check_layers.")
        for path, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            open(os.path.join(root, path), "w").write(text)
        return root
    layers = "low\nmid peer\nhigh\n"
    clean = {"layers.txt": layers, "low/a.h": "", "low/a.c": '#include "a.h"\n#include <stdio.h>\n',
             "mid/b.c": '#include "low/a.h"\n#include "missing_generated.h"\n',
             "high/c.c": '#include "mid/b.h"\n#include "../low/a.h"\n', "mid/b.h": "",
             "tests/t.c": '#include "high/c.h"\n'}
    cases = [
        ("clean tree", {}, 0),
        ("upward include", {"low/a.c": '#include "high/c.h"\n', "high/c.h": ""}, 1),
        ("upward through ../", {"low/a.c": '#include "../mid/b.h"\n'}, 1),
        ("peer include", {"peer/p.c": '#include "mid/b.h"\n'}, 1),
        ("unlisted folder", {"other/o.c": '#include "low/a.h"\n'}, 1),
    ]
    failed = 0
    for name, extra, want in cases:
        root = tree({**clean, **extra})
        errors, _ = check(root, os.path.join(root, "layers.txt"))
        got = 1 if errors else 0
        ok = got == want
        failed += not ok
        print(f"{'ok' if ok else 'FAIL'}: {name}: {len(errors)} error(s)" + (f" ({errors[0]})" if errors else ""))
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--root", default=os.path.dirname(here))
    ap.add_argument("--layers", default=None)
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--edges", action="store_true", help="also print the folder-to-folder includes found")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    layers = a.layers or os.path.join(a.root, "scripts", "layers.txt")
    errors, edges = check(a.root, layers)
    if a.edges:
        for s, d in sorted(edges):
            print(f"{s} -> {d}")
    for e in errors:
        print(e)
    print(f"check_layers: {len(errors)} error(s), {len(edges)} folder-to-folder include edges")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
