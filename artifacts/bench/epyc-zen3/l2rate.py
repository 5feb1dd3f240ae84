"""aotpack's dense GEMM with its weights in L2 (a 384 x 640 bf16 weight, 2 threads): G FMA/s a core, real kernel."""
import os, sys, time
from pathlib import Path
import torch
from exporter import kernels
from runtime.quant import native
DT = torch.bfloat16 if os.environ.get("DT", "bf16") == "bf16" else torch.float32
CODE = native.DTYPE_CODES[DT]
for arg in sys.argv[1:]:
    name, folder = arg.split("=")
    kernels.SOURCES = Path(folder)
    lib = kernels.build(log=lambda _: None, serve=False, one_tile=True).library
    call = lib._lib.aotpack_linear_dense
    N, K = 384, 640
    w = torch.randn(N, K).to(DT)
    out = []
    for m in (1, 4, 8):
        x = torch.randn(m, K).to(DT); y = torch.empty(m, N, dtype=DT)
        a = (x.data_ptr(), CODE, m, K, w.data_ptr(), CODE, N, y.data_ptr())
        for _ in range(200): call(*a)
        best = 1e9
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(2000): call(*a)
            best = min(best, (time.perf_counter() - t0) / 2000)
        out.append(f"{m} rows {best*1e6:.1f} us {m*N*K/8/best/2/1e9:.2f} G FMA/s/core")
    print(name, " | ".join(out))
