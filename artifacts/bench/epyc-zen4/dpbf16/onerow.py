"""One bundle in one process: its 1-row graph called directly, then one stream through rt.generate, then the
graph again. python -P artifacts/bench/epyc-zen4/dpbf16/onerow.py BUNDLE"""

import sys
import time

import torch

from exporter.bench.worker import direct_step_ms
from runtime import load

rt = load(sys.argv[1])
print("direct 1 row", [round(direct_step_ms(rt, 64, steps=30, batch=1), 2) for _ in range(3)])
print("direct 8 rows", round(direct_step_ms(rt, 64, steps=30, batch=8), 2))
ids = torch.randint(100, 1000, (1, 32))
for _ in range(3):
    t = time.perf_counter()
    out = rt.generate(ids, max_new_tokens=64, do_sample=False)
    dt = time.perf_counter() - t
    print("generate 64 tokens", round(dt * 1e3 / 64, 2), "ms/token (incl. prefill)")
print("direct 1 row after", [round(direct_step_ms(rt, 64, steps=30, batch=1), 2) for _ in range(3)])
