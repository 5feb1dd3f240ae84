"""The dpbf16 kernel from several source trees, interleaved in one process, weights in cache: us a call (median of
300 calls, median of 5 rounds) at 1 and 8 rows (ROWS=64,512 for prefill sizes), and whether the trees agree.

    python dpbf16_calls.py NAME=CSRC_DIR [NAME=CSRC_DIR ...]"""

import os
import statistics
import sys
import time
from pathlib import Path

import torch

from exporter import kernels
from runtime.quant import native

SHAPES = [(1536, 640), (640, 1536), (4096, 640)]
ROWS = tuple(int(m) for m in os.environ.get("ROWS", "1,8").split(","))


def main() -> None:
    libs = {}
    for arg in sys.argv[1:]:
        name, folder = arg.split("=")
        kernels.SOURCES = Path(folder)
        libs[name] = kernels.build(log=lambda _: None, serve=False).library
    code = native.DTYPE_CODES[torch.bfloat16]
    weights = {s: torch.randn(*s).to(torch.bfloat16) for s in SHAPES}
    times, outs = {}, {}
    for _ in range(5):
        for name, lib in libs.items():
            for n, k in SHAPES:
                for m in ROWS:
                    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
                    y = torch.empty(m, n, dtype=torch.bfloat16)
                    args = (x.data_ptr(), code, m, k, weights[(n, k)].data_ptr(), code, n, y.data_ptr())
                    for _ in range(20):
                        lib._lib.aotpack_linear_dpbf16(*args)
                    calls = []
                    for _ in range(300 if m <= 16 else 30):
                        start = time.perf_counter()
                        lib._lib.aotpack_linear_dpbf16(*args)
                        calls.append(time.perf_counter() - start)
                    times.setdefault((name, n, k, m), []).append(statistics.median(calls) * 1e6)
                    outs[(name, n, k, m)] = y.clone()
    first = next(iter(libs))
    for n, k in SHAPES:
        for m in ROWS:
            same = all(torch.equal(outs[(name, n, k, m)], outs[(first, n, k, m)]) for name in libs)
            cells = " | ".join(f"{name} {statistics.median(times[(name, n, k, m)]):.1f}" for name in libs)
            print(f"{n}x{k} m{m}", cells, "same bits" if same else "BITS DIFFER")


main()
