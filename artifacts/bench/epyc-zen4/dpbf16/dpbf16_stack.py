"""ms per pass over Gemma 3 270M's 18 layers' linears (cold: every weight its own tensor) and the lm_head,
bf16 weights and activations, at M rows: aotpack's dense GEMM (FMAs) against its dpbf16 GEMM (AVX512-BF16), interleaved
(median of 5 rounds). Run from the repository root: python artifacts/bench/epyc-zen4/dpbf16/dpbf16_stack.py"""

import os
import time

import torch

from exporter import kernels
from runtime.quant import native

torch.manual_seed(0)
lib = kernels.build(log=lambda _: None, serve=False).library
assert lib.dpbf16, f"this machine's kernels ({lib.isa}) cannot run the dpbf16 GEMM"
shapes = [(1024, 640), (256, 640), (256, 640), (640, 1024), (2048, 640), (2048, 640), (640, 2048)]
layers = [(torch.randn(n, k) / k**0.5).bfloat16() for _ in range(18) for n, k in shapes]
head = (torch.randn(262144, 640) / 640**0.5).bfloat16()
kernels_ = {"dense": native.linear_dense, "dpbf16": native.linear_dpbf16}
print(f"{lib.isa} kernels, {torch.get_num_threads()} threads; ms: layers + lm_head = step's linears")
for M in [int(m) for m in os.environ.get("MS", "1,2,4,8,16").split(",")]:
    xs = {k: torch.randn(M, k).bfloat16() for k in (640, 1024, 2048)}
    times = {name: ([], []) for name in kernels_}
    for _ in range(5):
        for name, fn in kernels_.items():
            start = time.perf_counter()
            for w in layers:
                fn(xs[w.shape[1]], w, lib)
            middle = time.perf_counter()
            fn(xs[640], head, lib)
            times[name][0].append((middle - start) * 1e3)
            times[name][1].append((time.perf_counter() - middle) * 1e3)
    cells = []
    for name, (lay, hd) in times.items():
        lay, hd = sorted(lay)[2], sorted(hd)[2]
        cells.append(f"{name} {lay:.1f} + {hd:.1f} = {lay + hd:.1f}")
    print(f"M={M}: " + " | ".join(cells), flush=True)
