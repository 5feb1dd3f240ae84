"""aotpack's int8 kernel (both builds: tiles, one-tile) on Gemma 3 270M's lm_head (262,144 x 640) and an MLP
projection (2,048 x 640) at 1 / 2 / 4 / 8 activation rows, called through ctypes, 2 threads; median of 20
calls each, rows interleaved. Run: python int8m.py OUT.json"""

import json
import statistics
import sys
import time

import torch

from exporter import kernels
from runtime.quant import native
from runtime.quant.int8_dot import arrange

torch.set_num_threads(2)
out = {}
for build, one in (("tiles", False), ("one-tile", True)):
    lib = kernels.build(log=lambda _: None, serve=False, one_tile=one).library
    for name, (n, k) in {"lm_head": (262144, 640), "mlp": (2048, 640)}.items():
        codes = arrange(torch.randint(-127, 128, (n, k), dtype=torch.int8))
        scales = torch.rand(n) * 0.01
        xs = {m: torch.randn(m, k) for m in (1, 2, 4, 8)}
        times = {m: [] for m in xs}
        for _ in range(20):
            for m, x in xs.items():
                t = time.perf_counter()
                native.linear_int8(x, codes, scales, lib)
                times[m].append(time.perf_counter() - t)
        out[f"{build} {name}"] = {m: round(statistics.median(v) * 1e3, 3) for m, v in times.items()}
        print(build, name, out[f"{build} {name}"], flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
