"""One int8 call's cost with its weights streamed from memory (copies cycled, 200 MB) and held in cache (one
copy called again), at 1 and 8 rows, for a decode step's small shapes and ten times their outputs.

    python ramp.py"""

import statistics
import time

import torch

from exporter import kernels
from runtime.quant import int8_dot, native

SHAPES = [(640, 2048), (6400, 2048), (2048, 640), (20480, 640)]


def main() -> None:
    lib = kernels.build(log=lambda _: None, serve=False, one_tile=True).library
    for n, k in SHAPES:
        copies = max(2, (200 << 20) // (n * k))
        weights = [
            (int8_dot.arrange(torch.randint(-127, 128, (n, k), dtype=torch.int8)), torch.rand(n)) for _ in range(copies)
        ]
        for m in (1, 8):
            x = torch.randn(m, k)
            runs = [native.prepared_cat("int8", x, [[w], [s]], lib=lib)[0] for w, s in weights]
            cold, hot = [], []
            for _ in range(5):
                for run in runs:
                    start = time.perf_counter()
                    run()
                    cold.append(time.perf_counter() - start)
                for _ in range(50):
                    start = time.perf_counter()
                    runs[0]()
                    hot.append(time.perf_counter() - start)
            c, h = statistics.median(cold) * 1e6, statistics.median(hot) * 1e6
            print(f"{n}x{k} m{m} cold {c:.1f} us ({n * k / c / 1e3:.1f} GB/s) hot {h:.1f} us")


main()
