"""aotpack's dense GEMM with its weights in L2 (a 384 x 640 weight, 2 threads) at 1, 4 and 8 rows: G FMA a second a
core, each build in turn (the call's fixed cost included: about 5 us through ctypes and OpenMP).

    DT=bf16|f32 python l2rate.py NAME=CSRC_DIR [NAME=CSRC_DIR ...]"""

import os
import sys
import time
from pathlib import Path

import torch

from exporter import kernels
from runtime.quant import native

DT = torch.bfloat16 if os.environ.get("DT", "bf16") == "bf16" else torch.float32
CODE = native.DTYPE_CODES[DT]
N, K = 384, 640


def rate(call, w: torch.Tensor, m: int) -> str:
    x = torch.randn(m, K).to(DT)
    y = torch.empty(m, N, dtype=DT)
    args = (x.data_ptr(), CODE, m, K, w.data_ptr(), CODE, N, y.data_ptr())
    for _ in range(200):
        call(*args)
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(2000):
            call(*args)
        best = min(best, (time.perf_counter() - t0) / 2000)
    return f"{m} rows {best * 1e6:.1f} us {m * N * K / 8 / best / 2 / 1e9:.2f} G FMA/s/core"


def main() -> None:
    w = torch.randn(N, K).to(DT)
    for arg in sys.argv[1:]:
        name, folder = arg.split("=")
        kernels.SOURCES = Path(folder)
        call = kernels.build(log=lambda _: None, serve=False, one_tile=True).library._lib.aotpack_linear_dense
        print(name, " | ".join(rate(call, w, m) for m in (1, 4, 8)))


main()
