#!/usr/bin/env python3
"""Writes N random token ids in [0, VOCAB) as a 1-D <i4 .npy file (the
format `tpr train --data` reads), standard library only, seeded.

    scripts/bench/random_tokens.py PATH N VOCAB [SEED]
"""
import random
import struct
import sys

if len(sys.argv) not in (4, 5):
    sys.exit(__doc__.strip())
path, n, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(int(sys.argv[4]) if len(sys.argv) == 5 else 0)
header = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % n
header = (header + " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n").encode("latin1")
with open(path, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header)
    f.write(struct.pack("<%di" % n, *(rng.randrange(vocab) for _ in range(n))))
