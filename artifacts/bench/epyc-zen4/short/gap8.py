"""The engine's step at N concurrent greedy streams (200 tokens each, one bundle): medians (ms) of s0-r0 (the
step's call starting), r0-r1 (the compiled graph), r1-s1 (choosing the tokens, stopping criteria, handing them
over) and s1-s0 (the loop), over the middle half of the run. python gap8.py BUNDLE N"""

import statistics
import sys
import time

import torch

from runtime import load
from runtime.engine import engine

marks = []


def streams(rt, n: int, new: int) -> None:
    """n greedy one-row requests of 32-token prompts at once, `new` tokens each, until all end (parts8.py too)."""
    handles = []
    for i in range(n):
        ids = torch.tensor([[1, *range(100 + i, 131 + i)]])
        handles.append(rt.submit(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new))
    for h in handles:
        h.wait()


def timed(run):
    def call(inputs):
        marks.append(("r0", time.perf_counter()))
        out = run(inputs)
        marks.append(("r1", time.perf_counter()))
        return out

    return call


def marked(step):
    def call(self, *args):
        marks.append(("s0", time.perf_counter()))
        step(self, *args)
        marks.append(("s1", time.perf_counter()))

    return call


def segments(rt, n: int, new: int) -> dict:
    marks.clear()
    streams(rt, n, new)
    m = marks[len(marks) // 4 : 3 * len(marks) // 4]
    while m and m[0][0] != "s0":
        m = m[1:]
    parts = {}
    for (a, at), (b, bt) in zip(m[:-1], m[1:], strict=True):
        parts.setdefault(f"{a}-{b}", []).append((bt - at) * 1e3)
    return {k: round(statistics.median(v), 3) for k, v in parts.items()}


def main() -> None:
    rt = load(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    rt.decode._runs = {b: timed(run) for b, run in rt.decode._runs.items()}
    engine.Engine._step = marked(engine.Engine._step)
    segments(rt, n, 16)
    for _ in range(3):
        print(segments(rt, n, 200))


if __name__ == "__main__":
    main()
