"""aotpack's int8 kernel from several source trees, interleaved in one process, on Gemma 3 270M's shapes at 1
and 8 rows, every call's weights streamed from memory (copies of the small weights cycled, 96 MB of them).

    python kernels.py NAME=CSRC_DIR [NAME=CSRC_DIR ...]

A NAME ending in "1t" builds its tree with one weight tile a pass. Every build must give the same bits."""

import statistics
import sys
import time
from pathlib import Path

import torch

from exporter import kernels
from runtime.quant import int8_dot, native

SHAPES = [(262144, 640), (2048, 640), (640, 2048), (1024, 640)]


def libraries() -> dict:
    built = {}
    for arg in sys.argv[1:]:
        name, folder = arg.split("=")
        kernels.SOURCES = Path(folder)
        built[name] = kernels.build(log=lambda _: None, serve=False, one_tile=name.endswith("1t")).library
    return built


def main() -> None:
    libs = libraries()
    torch.manual_seed(0)
    weights = {s: (int8_dot.arrange(torch.randint(-127, 128, s, dtype=torch.int8)), torch.rand(s[0])) for s in SHAPES}
    n = {s: max(1, (96 << 20) // (s[0] * s[1])) for s in SHAPES}
    copies = {s: [tuple(t.clone() for t in weights[s]) for _ in range(n[s])] for s in SHAPES}
    xs = {m: {s: torch.randn(m, s[1]) for s in SHAPES} for m in (1, 8)}
    first = [native.linear_int8(xs[8][SHAPES[1]], *weights[SHAPES[1]], lib) for lib in libs.values()]
    assert all(torch.equal(y, first[0]) for y in first), "the builds differ"

    def ms(lib, m, s, reps):
        times = []
        for i in range(reps):
            codes, scales = copies[s][i % len(copies[s])]
            start = time.perf_counter()
            native.linear_int8(xs[m][s], codes, scales, lib)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    res = {}
    for _ in range(5):
        for name, lib in libs.items():
            for s in SHAPES:
                for m in (1, 8):
                    res.setdefault((name, s, m), []).append(ms(lib, m, s, 9 if s[0] > 100000 else 300))
    for s in SHAPES:
        med = {(n, m): statistics.median(res[(n, s, m)]) for n in libs for m in (1, 8)}
        cells = [f"{n} m1 {med[(n, 1)]:.3f} m8 {med[(n, 8)]:.3f}" for n in libs]
        print(f"{s[0]}x{s[1]}", " | ".join(cells))


main()
