"""Each bundle's 1- and 8-row decode graphs called directly with every row at contexts 64, 512 and 2,000 of its
2,048-slot cache, interleaved in one process, 4 rounds (bundles whose kernels.so share a soname must be timed in
separate processes).

    python positions.py BUNDLE [BUNDLE ...]"""

import statistics
import sys

from exporter.bench.worker import direct_step_ms
from runtime import load

runtimes = {path: load(path) for path in sys.argv[1:]}
times = {}
for _ in range(4):
    for path, rt in runtimes.items():
        for batch in (1, 8):
            for position in (64, 512, 2000):
                times.setdefault((path, batch, position), []).append(direct_step_ms(rt, position, 15, batch))
for path in runtimes:
    med = {key[1:]: statistics.median(value) for key, value in times.items() if key[0] == path}
    cells = [f"{b} rows at {p}: {ms:.2f} ms" for (b, p), ms in med.items()]
    print(path, " | ".join(cells))
