#!/usr/bin/env python3
"""Writes tests/fixtures/npy/tokens_<dtype>_v<major>.npy with numpy's own
writer (np.lib.format.write_array, the code under np.save) for every token
dtype tpr reads ('<u2', '<u4', '<i4', '<i8') in format versions 1.0, 2.0 and
3.0, so test_train_data proves train/npy.c reads what numpy writes, not
only what its own test writer lays out.

    scripts/reference/.venv/bin/python scripts/reference/make_npy_fixture.py \
        [--out-dir tests/fixtures/npy]

Every file holds TOKENS below.
"""
import argparse
import os

import numpy as np

TOKENS = [5, 0, 1, 2, 65535]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures",
                                                      "npy"))
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    for dt in ("u2", "u4", "i4", "i8"):
        a = np.array(TOKENS, dtype="<" + dt)
        for major in (1, 2, 3):
            path = os.path.join(args.out_dir, f"tokens_{dt}_v{major}.npy")
            with open(path, "wb") as f:
                np.lib.format.write_array(f, a, version=(major, 0))
            b = np.load(path)
            assert b.dtype == a.dtype and (b == a).all()
            print("wrote", path)


if __name__ == "__main__":
    main()
