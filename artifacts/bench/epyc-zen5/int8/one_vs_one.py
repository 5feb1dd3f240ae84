"""One stream on a batch-1 bundle against one stream on a batch-8 bundle: greedy decode ms/token, interleaved rounds."""
import sys, time, statistics, torch
from runtime import load
rts = {p: load(p) for p in sys.argv[1:]}
import os
ids = (torch.arange(100, 132)[None] + torch.arange(int(os.environ.get("ROWS", "1")))[:, None])
res = {p: [] for p in rts}
for p, rt in rts.items():
    rt.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
for rnd in range(5):
    for p, rt in rts.items():
        t0 = time.perf_counter(); rt.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False); t1 = time.perf_counter()
        out = rt.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=66, do_sample=False); t2 = time.perf_counter()
        n = out.shape[1] - ids.shape[1]
        res[p].append(((t2 - t1) - (t1 - t0)) / (n - 2) * 1e3)  # n - 2 more tokens: prefill and the first step cancel out
for p, v in res.items():
    print(p, "ms/token", [round(x, 2) for x in v], "median", round(statistics.median(v), 2), flush=True)
