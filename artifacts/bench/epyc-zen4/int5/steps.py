"""Batch-1 bundles' decode steps called directly at a context of 64 and 1,024, interleaved in one process,
ROUNDS rounds (default 6): medians and ranges.

python -P steps.py BUNDLE [BUNDLE ...]"""

import os
import statistics
import sys

from exporter.bench.worker import direct_step_ms
from runtime import load

runtimes = {path: load(path) for path in sys.argv[1:]}
times = {}
for _ in range(int(os.environ.get("ROUNDS", "6"))):
    for path, rt in runtimes.items():
        for context in (64, 1024):
            times.setdefault((path, context), []).append(direct_step_ms(rt, context, steps=40, batch=1))
for path in runtimes:
    spans = ((c, times[(path, c)]) for c in (64, 1024))
    print(path, " ".join(f"ctx {c}: {statistics.median(t):.2f} ms ({min(t):.2f}-{max(t):.2f})" for c, t in spans))
