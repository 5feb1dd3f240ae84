"""Each bundle's decode graphs called directly at 1 and 8 rows (context 64), interleaved in one process, 6 rounds.

python steps.py BUNDLE [BUNDLE ...]"""

import statistics
import sys

from exporter.bench.worker import direct_step_ms
from runtime import load

runtimes = {path: load(path) for path in sys.argv[1:]}
times = {}
for _ in range(6):
    for path, rt in runtimes.items():
        for batch in (1, 8):
            times.setdefault((path, batch), []).append(direct_step_ms(rt, 64, steps=30, batch=batch))
for path in runtimes:
    print(path, " ".join(f"{b} rows {statistics.median(times[(path, b)]):.2f} ms" for b in (1, 8)))
