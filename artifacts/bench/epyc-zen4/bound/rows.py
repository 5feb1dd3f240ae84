"""Each decode graph of the bundles given, called directly with all its rows at context 64, interleaved
in one process, 4 rounds: medians and ranges (ms). python -P rows.py BUNDLE [BUNDLE ...]"""

import statistics
import sys

from exporter.bench.worker import direct_step_ms
from runtime import load

runtimes = {path: load(path) for path in sys.argv[1:]}
times = {}
for _ in range(4):
    for path, rt in runtimes.items():
        for batch in rt.manifest.batches:
            times.setdefault((path, batch), []).append(direct_step_ms(rt, 64, steps=30, batch=batch))
for (path, batch), t in times.items():
    print(path, batch, f"{statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f})")
