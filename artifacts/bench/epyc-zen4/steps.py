"""Each bundle's decode graphs called directly at 1, 2, 4 and 8 rows (context 64), interleaved in one process,
ROUNDS rounds (default 6). Bundles whose kernels.so share a soname must be timed in separate processes.

python steps.py BUNDLE [BUNDLE ...]"""

import os
import statistics
import sys

from exporter.bench.worker import direct_step_ms
from runtime import load

runtimes = {path: load(path) for path in sys.argv[1:]}
times = {}
for _ in range(int(os.environ.get("ROUNDS", "6"))):
    for path, rt in runtimes.items():
        for batch in (1, 2, 4, 8):
            times.setdefault((path, batch), []).append(direct_step_ms(rt, 64, steps=30, batch=batch))
for path in runtimes:
    print(path, " ".join(f"{b} rows {statistics.median(times[(path, b)]):.2f} ms" for b in (1, 2, 4, 8)))
