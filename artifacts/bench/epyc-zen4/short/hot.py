"""aotpack's int8 kernel from several source trees, interleaved in one process: weights that stay in cache
(8,192 x 640) and Gemma 3 270M's shapes streamed, at 1 and 8 rows, 5 rounds, median ms a call.

    python -P hot.py NAME=CSRC_DIR [NAME=CSRC_DIR ...]   (OMP_NUM_THREADS=1 for one thread)

Every build must give the same bits."""

import statistics
import sys
import time
from pathlib import Path

import torch

from exporter import kernels
from runtime.quant import int8_dot, native

SHAPES = [(8192, 640), (2048, 640), (640, 2048), (262144, 640)]


def main() -> None:
    libs = {}
    for arg in sys.argv[1:]:
        name, folder = arg.split("=")
        kernels.SOURCES = Path(folder)
        libs[name] = kernels.build(log=lambda _: None, serve=False).library
    torch.manual_seed(0)
    ws = {s: (int8_dot.arrange(torch.randint(-127, 128, s, dtype=torch.int8)), torch.rand(s[0])) for s in SHAPES}
    xs = {(s, m): torch.randn(m, s[1]) for s in SHAPES for m in (1, 8)}
    outs = [native.linear_int8(xs[(SHAPES[1], 8)], *ws[SHAPES[1]], lib) for lib in libs.values()]
    print("same bits:", all(torch.equal(y, outs[0]) for y in outs))
    res = {}
    for _ in range(5):
        for name, lib in libs.items():
            for s in SHAPES:
                for m in (1, 8):
                    times = []
                    for _ in range(8 if s[0] > 100000 else 300):
                        start = time.perf_counter()
                        native.linear_int8(xs[(s, m)], *ws[s], lib)
                        times.append(time.perf_counter() - start)
                    res.setdefault((name, s, m), []).append(statistics.median(times) * 1e3)
    for s in SHAPES:
        print(s, " | ".join(f"{n} m{m} {statistics.median(res[(n, s, m)]):.4f}" for n in libs for m in (1, 8)))


if __name__ == "__main__":
    main()
