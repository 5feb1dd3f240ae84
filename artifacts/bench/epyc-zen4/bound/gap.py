"""Where a token's time goes in the engine's thread: `python gap.py BUNDLE` prints, per 200-token
request of one stream, the medians (ms) of s0-r0 (the step's call starting: positions, pad mask,
checks), r0-r1 (the compiled graph), r1-s1 (choosing the token, stopping criteria, handing it over)
and s1-s0 (the loop), and the token time rt.generate's timestamps give."""

import statistics
import sys
import time

import torch

from runtime import load
from runtime.engine import engine

rt = load(sys.argv[1])
marks = []
runs = rt.decode._runs


def timed(run):
    def call(inputs):
        marks.append(("r0", time.perf_counter()))
        out = run(inputs)
        marks.append(("r1", time.perf_counter()))
        return out

    return call


rt.decode._runs = {b: timed(run) for b, run in runs.items()}
step = engine.Engine._step


def marked(self, *args):
    marks.append(("s0", time.perf_counter()))
    step(self, *args)
    marks.append(("s1", time.perf_counter()))


engine.Engine._step = marked
ids = torch.tensor([[1, *range(100, 131)]])


def one(new: int) -> dict:
    marks.clear()
    handle = rt.submit(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new)
    handle.wait()
    segments = {}
    for (a, at), (b, bt) in zip(marks[8:-9], marks[9:-8], strict=True):
        segments.setdefault(f"{a}-{b}", []).append((bt - at) * 1e3)
    times = handle.times
    token = (times[-1] - times[1]) / (len(times) - 2) * 1e3
    return {k: round(statistics.median(v), 3) for k, v in segments.items()} | {"token": round(token, 3)}


one(16)
for _ in range(3):
    print(one(200))
