"""The decode attention candidates on SmolLM2-135M's shapes (9 query heads over 3 key/value heads of 64, one
row), eager, each its fastest pass of 7: hot (one set of keys and values called again and again, as the export
timed them before) and cold (cycling through 64 MB of copies, as the step reads a layer's cache after the
weights streamed past it). Prints span, copies, {candidate: (hot us, cold us)}.

    python attention.py"""

import math
import time

import torch

from exporter import attention, kernels

HEADS, KV, D = 9, 3, 64


def example(span: int) -> tuple:
    q = torch.randn(1, HEADS, 1, D)
    k, v = torch.randn(1, KV, span, D), torch.randn(1, KV, span, D)
    return q, k, v, torch.ones(1, 1, 1, span, dtype=torch.bool)


def us_per_call(fn, sets: list[tuple], rounds: int) -> float:
    best = []
    for _ in range(rounds):
        start = time.perf_counter()
        for q, k, v, mask in sets:
            fn(None, q, k, v, mask, scaling=D**-0.5)
        best.append((time.perf_counter() - start) / len(sets))
    return min(best) * 1e6


def main() -> None:
    kernels.build(log=lambda _: None)
    torch.manual_seed(0)
    for span in (128, 512, 1024, 1536):
        copies = max(1, math.ceil(64e6 / (2 * KV * span * D * 4)))
        sets = [example(span) for _ in range(copies)]
        row = {}
        for name in (attention.FLASH, attention.GROUPED, attention.NATIVE):
            fn = attention.FUNCTIONS[name]
            us_per_call(fn, sets[:1], 2)
            row[name] = (round(us_per_call(fn, sets[:1], 7), 1), round(us_per_call(fn, sets, 3), 1))
        print(span, copies, row)


if __name__ == "__main__":
    main()
