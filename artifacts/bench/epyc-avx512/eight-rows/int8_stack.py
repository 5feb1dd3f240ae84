"""ms per pass over Gemma 3 270M's 18 layers' int8 linears (cold weights, as in a step) and the lm_head, at M rows, per library (interleaved rounds)."""
import sys, time, torch
from pathlib import Path
from runtime.quant import native, int8_dot
torch.manual_seed(0)
libs = [native.Library(Path(p)) for p in sys.argv[1:]]
shapes = [(1024, 640), (256, 640), (256, 640), (640, 1024), (2048, 640), (2048, 640), (640, 2048)]
def w(n, k): return int8_dot.arrange(torch.randint(-127, 128, (n, k), dtype=torch.int8)), torch.rand(n) / 100
layers = [w(n, k) for _ in range(18) for n, k in shapes]
head = w(262144, 640)
for M in [int(m) for m in __import__("os").environ.get("MS", "1,4,8").split(",")]:
    xs = {k: torch.randn(M, k) for k in (640, 1024, 2048)}
    res = [[] for _ in libs]; hres = [[] for _ in libs]
    for rnd in range(5):
        for i, lib in enumerate(libs):
            t = time.perf_counter()
            for c, s in layers: native.linear_int8(xs[c.shape[1]], c, s, lib)
            t1 = time.perf_counter()
            native.linear_int8(xs[640], *head, lib)
            res[i].append((t1 - t) * 1e3); hres[i].append((time.perf_counter() - t1) * 1e3)
    print(f"M={M}: layers " + "  ".join(f"{sorted(r)[2]:.2f}" for r in res) + " | lm_head " + "  ".join(f"{sorted(r)[2]:.2f}" for r in hres), flush=True)
