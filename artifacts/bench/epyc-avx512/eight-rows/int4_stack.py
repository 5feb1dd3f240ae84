import sys, time, torch
from pathlib import Path
from runtime.quant import native, int4_dot
torch.manual_seed(0)
libs = [native.Library(Path(p)) for p in sys.argv[1:]]
shapes = [(1024, 640), (256, 640), (256, 640), (640, 1024), (2048, 640), (2048, 640), (640, 2048)]
def w(n, k): return int4_dot.arrange(torch.randint(0, 16, (n, k))), (torch.rand(n, k // 32) / 100).bfloat16(), (torch.rand(n, k // 32) / 100).bfloat16()
layers = [w(n, k) for _ in range(18) for n, k in shapes]
head = w(262144, 640)
for M in (1, 4, 8):
    xs = {k: torch.randn(M, k) for k in (640, 1024, 2048)}
    res = [[] for _ in libs]; hres = [[] for _ in libs]; outs = []
    for rnd in range(5):
        for i, lib in enumerate(libs):
            t = time.perf_counter()
            for c, s, mn in layers: native.linear_int4(xs[c.shape[1] * 2], c, s, mn, 32, lib)
            t1 = time.perf_counter()
            y = native.linear_int4(xs[640], *head, 32, lib)
            if rnd == 0: outs.append(y)
            res[i].append((t1 - t) * 1e3); hres[i].append((time.perf_counter() - t1) * 1e3)
    print(f"int4 M={M}: layers " + "  ".join(f"{sorted(r)[2]:.2f}" for r in res) + " | lm_head " + "  ".join(f"{sorted(r)[2]:.2f}" for r in hres) + f" same={all(torch.equal(outs[0], o) for o in outs)}", flush=True)
