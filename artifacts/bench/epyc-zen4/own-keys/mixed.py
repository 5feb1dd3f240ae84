"""The 8-row graph of BUNDLE called directly (ms, median of 30 after warm-up) with its rows at mixed positions:
python mixed.py BUNDLE (ab.txt); each case: the positions of rows 0-7."""

import statistics
import sys
import time

import torch

from runtime import load
from runtime.model.positions import RowPositions

CASES = {
    "all at 100": [100] * 8,
    "one at 2000, 7 at 100": [2000] + [100] * 7,
    "all at 2000": [2000] * 8,
    "one at 1000, 7 at 300": [1000] + [300] * 7,
}


def step_ms(rt, positions, steps=30, warm=5):
    b = len(positions)
    rows = RowPositions(b, rt.contract.max_cache_len, rt.contract.device)
    for r, p in enumerate(positions):
        rows.place(slice(r, r + 1), torch.ones(1, p + 1, dtype=torch.long), p)
    rows.advance(torch.ones(b, dtype=torch.bool))
    position, index, mask = rows.inputs(b)
    step = rt.decode.bind(torch.full((b, 1), 17), position, index, [t[:b] for t in rt.kv])
    times = []
    with torch.inference_mode():
        for _ in range(steps + warm):
            start = time.perf_counter()
            step(mask)
            times.append(time.perf_counter() - start)
    return statistics.median(times[warm:]) * 1e3


rt = load(sys.argv[1])
print(sys.argv[1].rsplit("/", 1)[-1], " | ".join(f"{k}: {step_ms(rt, v):.2f}" for k, v in CASES.items()), flush=True)
