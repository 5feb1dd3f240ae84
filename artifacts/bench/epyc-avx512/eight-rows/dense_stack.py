"""ms per pass over Gemma 3 270M's 18 layers' dense linears (cold) and the lm_head, at M rows, per library; checks identical outputs."""
import os, sys, time, torch
from pathlib import Path
from runtime.quant import native
torch.manual_seed(0)
dt = getattr(torch, os.environ.get("DT", "float32"))
libs = [native.Library(Path(p)) for p in sys.argv[1:]]
shapes = [(1024, 640), (256, 640), (256, 640), (640, 1024), (2048, 640), (2048, 640), (640, 2048)]
layers = [torch.randn(n, k).to(dt) for _ in range(18) for n, k in shapes]
head = torch.randn(262144, 640).to(dt)
for M in [int(m) for m in os.environ.get("MS", "1,4,8").split(",")]:
    xs = {k: torch.randn(M, k) for k in (640, 1024, 2048)}
    res = [[] for _ in libs]; hres = [[] for _ in libs]; outs = []
    for rnd in range(5):
        for i, lib in enumerate(libs):
            t = time.perf_counter()
            for w in layers: native.linear_dense(xs[w.shape[1]], w, lib)
            t1 = time.perf_counter()
            y = native.linear_dense(xs[640], head, lib)
            if rnd == 0: outs.append(y)
            res[i].append((t1 - t) * 1e3); hres[i].append((time.perf_counter() - t1) * 1e3)
    print(f"{dt} M={M}: layers " + "  ".join(f"{sorted(r)[2]:.2f}" for r in res) + " | lm_head " + "  ".join(f"{sorted(r)[2]:.2f}" for r in hres) + f" same={all(torch.equal(outs[0], o) for o in outs)}", flush=True)
