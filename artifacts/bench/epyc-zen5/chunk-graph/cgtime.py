"""Chunk graph vs eager chunks: per-piece prefill time while one stream decodes; whole prompt alone."""
import sys, time, torch
from runtime import load
from runtime.config import LoadConfig
from runtime.engine import engine as E
rt = load(sys.argv[1], LoadConfig(prefix_cache=False))
C = rt.engine.runner.chunk_tokens
times = []
orig = E.Engine._prefill
def pre(self, piece):
    t = time.perf_counter()
    try: return orig(self, piece)
    finally: times.append((piece.end - piece.start, time.perf_counter() - t))
E.Engine._prefill = pre
g = torch.Generator().manual_seed(0)
long = torch.randint(10, 20000, (1, 512), generator=g)
short = torch.randint(10, 20000, (1, 16), generator=g)
def admit(n):
    rt.engine.chunk_prefills(n); times.clear()
    h1 = rt.submit(short, max_new_tokens=300, do_sample=False, eos_token_id=0)
    it = iter(h1); next(it)
    t = time.perf_counter(); h2 = rt.submit(long, max_new_tokens=1, do_sample=False); h2.result(); total = time.perf_counter() - t
    h1.cancel(); ch = sorted(s for k, s in times if k == n)
    return 1000 * ch[len(ch) // 2], total
def whole():
    rt.engine.chunk_prefills(None); times.clear()
    t = time.perf_counter(); rt.submit(long, max_new_tokens=1, do_sample=False).result(); return time.perf_counter() - t
for rnd in range(2):
    for mode in ("graph", "eager"):
        rt.engine.runner.chunk_tokens = C if mode == "graph" else 0
        row = [f"{n}: {admit(n)[0]:.1f} ms (prompt {admit(n)[1]:.2f} s)" for n in (C, 2 * C, 4 * C)]
        print(rnd, mode, "chunk", " | ".join(row), f"| whole 512 alone {whole():.2f} s", flush=True)
