"""int8, int5 and int4 integer kernels at one activation row on SmolLM2-135M's MLP shape (1536 x 576), each
over 60 copies of the weight (cold, 53-85 MB), the fastest of 5 passes, in both builds (several tiles a pass,
or one with `one`), each kernel twice in turn.

python calls.py [one]"""

import sys
import time

import torch

from exporter import kernels
from runtime.quant import int4_dot, int5_dot, int8_dot, native, tiles

lib = kernels.build(log=lambda _: None, one_tile=len(sys.argv) > 1).library
torch.set_num_threads(2)
N, K, COPIES = 1536, 576, 60
g = torch.Generator().manual_seed(0)
w8 = [int8_dot.arrange(torch.randint(-127, 128, (N, K), generator=g).to(torch.int8)) for _ in range(COPIES)]
s8 = torch.rand(N)
w5 = [int5_dot.arrange(torch.randint(0, 32, (N, K), generator=g)) for _ in range(COPIES)]
s5 = tiles.tile_rows(torch.rand(N, K // 32).half())
w4 = [int4_dot.arrange(torch.randint(0, 16, (N, K), generator=g)) for _ in range(COPIES)]
s4, m4 = (tiles.tile_rows(torch.rand(N, K // 32).bfloat16()) for _ in range(2))
x = torch.randn(1, K)
CALLS = {
    "int8": lambda: [native.linear_int8(x, w, s8, lib) for w in w8],
    "int5": lambda: [native.linear_int5(x, c, h, s5, 32, lib) for c, h in w5],
    "int4": lambda: [native.linear_int4(x, c, s4, m4, 32, lib) for c in w4],
}
BYTES = {"int8": N * K + 4 * N, "int5": N * K * 5 / 8 + N * K / 16, "int4": N * K / 2 + N * K / 8}
for name in [*CALLS, *CALLS]:
    CALLS[name]()
    best = 1e9
    for _ in range(5):
        start = time.perf_counter()
        CALLS[name]()
        best = min(best, time.perf_counter() - start)
    print(f"{name} {best / COPIES * 1e6:.1f} us a call, {BYTES[name] * COPIES / best / 1e9:.1f} GB/s")
