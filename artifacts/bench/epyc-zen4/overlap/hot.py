"""Int8 calls of one weight held in cache, several kernel source trees interleaved, at 1 and 8 rows: us a call
(median of 300 calls, median of 7 rounds), and whether the trees give the same bits.

    python hot.py NAME=CSRC_DIR [NAME=CSRC_DIR ...]"""

import statistics
import sys
import time
from pathlib import Path

import torch

from exporter import kernels
from runtime.quant import int8_dot, native

SHAPES = [(1536, 640), (640, 2048), (4096, 640)]


def main() -> None:
    libs = {}
    for arg in sys.argv[1:]:
        name, folder = arg.split("=")
        kernels.SOURCES = Path(folder)
        libs[name] = kernels.build(log=lambda _: None, serve=False, one_tile=True).library
    torch.manual_seed(0)
    weights = {s: (int8_dot.arrange(torch.randint(-127, 128, s, dtype=torch.int8)), torch.rand(s[0])) for s in SHAPES}
    times, outs = {}, {}
    for _ in range(7):
        for name, lib in libs.items():
            for s in SHAPES:
                for m in (1, 8):
                    x = torch.randn(m, s[1], generator=torch.Generator().manual_seed(m))
                    run, y = native.prepared_cat("int8", x, [[weights[s][0]], [weights[s][1]]], lib=lib)
                    for _ in range(50):
                        run()
                    calls = []
                    for _ in range(300):
                        start = time.perf_counter()
                        run()
                        calls.append(time.perf_counter() - start)
                    times.setdefault((name, s, m), []).append(statistics.median(calls) * 1e6)
                    outs[(name, s, m)] = y.clone()
    for s in SHAPES:
        for m in (1, 8):
            same = all(torch.equal(outs[(n, s, m)], outs[(next(iter(libs)), s, m)]) for n in libs)
            cells = " | ".join(f"{n} {statistics.median(times[(n, s, m)]):.1f} us" for n in libs)
            print(f"{s} m{m}", cells, "same bits" if same else "BITS DIFFER")


main()
