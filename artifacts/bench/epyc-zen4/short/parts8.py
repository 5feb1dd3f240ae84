"""The engine's parts after the graph at N greedy streams, ms a step (each part's total over a 200-token run
divided by the steps): python parts8.py BUNDLE N"""

import collections
import sys
import time

from gap8 import streams

from runtime import load
from runtime.engine import engine, request, sampling
from runtime.engine import runner as runner_module

rt = load(sys.argv[1])
N = int(sys.argv[2]) if len(sys.argv) > 2 else 8
spent = collections.defaultdict(list)


def wrap(owner, name: str) -> None:
    f = getattr(owner, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = f(*args, **kwargs)
        spent[name].append((time.perf_counter() - start) * 1e3)
        return out

    setattr(owner, name, timed)


for owner, name in [(sampling, "greedy"), (request.RequestState, "choose"), (request.RequestState, "_stop")]:
    wrap(owner, name)
for owner, name in [(request.RequestState, "put"), (runner_module.Runner, "feed"), (engine.Engine, "_emit")]:
    wrap(owner, name)
wrap(engine.Engine, "_step")


def one(new: int) -> dict:
    spent.clear()
    streams(rt, N, new)
    steps = len(spent["_step"])
    return {k: round(sum(v) / steps, 3) for k, v in spent.items()}


one(16)
for _ in range(2):
    print(one(200))
