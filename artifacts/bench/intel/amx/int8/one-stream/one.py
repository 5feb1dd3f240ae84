"""One stream of 128 greedy tokens through a bundle, 3 times, then its batch-1 step called directly.

Usage: python one.py BUNDLE (from the repository root; run the bundles in alternating fresh processes).
"""

import sys

from exporter.bench.streams import _prompts, concurrent
from exporter.bench.worker import direct_step_ms
from runtime import load

rt = load(sys.argv[1])
prompts = _prompts(rt.validator.vocab_size, 1, 32)
rt.generate(prompts[0], max_new_tokens=4)
res = [concurrent(rt, prompts, 128) for _ in range(3)]
step = direct_step_ms(rt, 64, steps=20, batch=1)
rates = " ".join(f"{r['tokens_per_s']:.1f}" for r in res)
gaps = " ".join(f"{r['itl_p50_ms']:.2f}" for r in res)
print(sys.argv[1].rsplit("/", 1)[1], "tok/s", rates, "itl p50", gaps, f"step {step:.2f}", flush=True)
