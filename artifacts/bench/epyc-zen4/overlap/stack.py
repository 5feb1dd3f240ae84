"""Gemma 3 270M's int8 linears as a decode step calls them (18 layers, each its own weights: qkv in one call,
o, gate+up in one call, down; then lm_head), each kernel source tree's build interleaved in one process, at 1
and 8 rows; ms a step. HOT=1: one layer's weights (5.9 MB, in L3) for all 18. A NAME ending in "1t" builds its
tree with one weight tile a pass (what the exports of Gemma 3 choose here).

    python stack.py NAME=CSRC_DIR [NAME=CSRC_DIR ...]"""

import os
import statistics
import sys
import time
from pathlib import Path

import torch

from exporter import kernels
from runtime.quant import int8_dot, native

LAYER = [[(1024, 640), (256, 640), (256, 640)], [(640, 1024)], [(2048, 640), (2048, 640)], [(640, 2048)]]
ROUNDS = 15
HOT = os.environ.get("HOT") == "1"


def libraries() -> dict:
    built = {}
    for arg in sys.argv[1:]:
        name, folder = arg.split("=")
        kernels.SOURCES = Path(folder)
        built[name] = kernels.build(log=lambda _: None, serve=False, one_tile=name.endswith("1t")).library
    return built


def weight(shape):
    return int8_dot.arrange(torch.randint(-127, 128, shape, dtype=torch.int8)), torch.rand(shape[0])


XS = {}


def prepared(call, m, lib):
    k = call[0][0].shape[1]
    x = XS.setdefault((m, k), torch.randn(m, k))
    return native.prepared_cat("int8", x, [[w[0] for w in call], [w[1] for w in call]], lib=lib)


def main() -> None:
    libs = libraries()
    torch.manual_seed(0)
    layers = [[[weight(s) for s in call] for call in LAYER] for _ in range(1 if HOT else 18)] * (18 if HOT else 1)
    head = [weight((262144, 640))]
    runs = {}
    for name, lib in libs.items():
        for m in (1, 8):
            runs[(name, m)] = ([prepared(c, m, lib) for layer in layers for c in layer], prepared(head, m, lib))
    for m in (1, 8):
        outs = []
        for n in libs:
            runs[(n, m)][0][3][0]()
            runs[(n, m)][1][0]()
            outs.append((runs[(n, m)][0][3][1].clone(), runs[(n, m)][1][1].clone()))
        assert all(torch.equal(a, outs[0][0]) and torch.equal(b, outs[0][1]) for a, b in outs), "the builds differ"
    res, kinds = {}, {}
    for _ in range(ROUNDS):
        for name in libs:
            for m in (1, 8):
                calls, (head_run, _) = runs[(name, m)]
                t0 = time.perf_counter()
                for i, (run, _y) in enumerate(calls):
                    start = time.perf_counter()
                    run()
                    kinds[(name, m, i % 4)] = kinds.get((name, m, i % 4), 0) + time.perf_counter() - start
                t1 = time.perf_counter()
                head_run()
                t2 = time.perf_counter()
                res.setdefault((name, m, "layers"), []).append((t1 - t0) * 1e3)
                res.setdefault((name, m, "head"), []).append((t2 - t1) * 1e3)
    for k in range(4):  # the 18 layers' calls of each kind, ms a step (mean over the rounds)
        print(
            ("qkv", "o", "gate+up", "down")[k],
            " | ".join(
                f"{n} m1 {kinds[(n, 1, k)] / ROUNDS * 1e3:.3f} m8 {kinds[(n, 8, k)] / ROUNDS * 1e3:.3f}" for n in libs
            ),
        )
    for part in ("layers", "head"):
        cells = [
            f"{n} m1 {statistics.median(res[(n, 1, part)]):.3f} m8 {statistics.median(res[(n, 8, part)]):.3f}"
            for n in libs
        ]
        print(part, " | ".join(cells))


main()
