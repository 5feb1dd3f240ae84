"""Batch-1 graphs of several bundles in one process, alternating (ms, median of 20 a turn): python inproc.py B..."""

import sys

from exporter.bench.worker import direct_step_ms
from runtime import load

rts = {p.rsplit("/", 1)[-1]: load(p) for p in sys.argv[1:]}
for turn in range(6):
    print(turn, " ".join(f"{k}={direct_step_ms(rt, 64, steps=20, batch=1):.2f}" for k, rt in rts.items()), flush=True)
