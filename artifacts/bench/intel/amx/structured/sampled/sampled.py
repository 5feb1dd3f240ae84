"""8 sampled requests through rt.submit (top-k 64, top-p 0.95, the top-k sampler), free and held to the bench's
schema in turn: the median of the engine's own step intervals once all 8 decode (Handle.times), and the wall time.

    python sampled.py BUNDLE [ROUNDS]

Run for sampled.txt on the Intel Xeon (AMX) with an int8 Gemma 3 270M bundle of 8 rows and 2,048 slots,
alternating this checkout and the one before the pool (a git worktree, through PYTHONPATH)."""

import statistics
import sys
import threading
import time

from exporter.bench.structured import SCHEMA
from runtime import load

rt = load(sys.argv[1])
tok = rt.tokenizer
_ = rt.grammar_tokenizer  # built once, before timing
prompts = [tok(f"Tell me a story about the number {i}.", return_tensors="pt").input_ids for i in range(8)]


def run(constrained: bool, n: int = 8, new: int = 64) -> tuple[float, float]:
    gaps = []

    def one(ids):
        lp = [rt.constrain("json_schema", SCHEMA)] if constrained else []
        h = rt.submit(
            ids, max_new_tokens=new, do_sample=True, temperature=1.0, top_k=64, top_p=0.95, sampler="top-k",
            logits_processor=lp,
        )  # fmt: skip
        for _ in h:
            pass
        ts = h.times[8:] if len(h.times) > 10 else h.times  # steps after all 8 are in
        gaps.extend(b - a for a, b in zip(ts, ts[1:], strict=False))

    threads = [threading.Thread(target=one, args=(p,)) for p in prompts[:n]]
    start = time.perf_counter()
    [t.start() for t in threads]
    [t.join() for t in threads]
    return time.perf_counter() - start, statistics.median(gaps) * 1e3


run(False, 2, 8)
run(True, 2, 8)
for r in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3):
    for constrained in (False, True):
        wall, gap = run(constrained)
        print(r, "json" if constrained else "free", f"wall {wall:.2f} s gap p50 {gap:.2f} ms", flush=True)
