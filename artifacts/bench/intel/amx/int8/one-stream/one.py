import sys, torch
from runtime import load
from exporter.bench.streams import concurrent, _prompts
from exporter.bench.worker import direct_step_ms
rt = load(sys.argv[1])
prompts = _prompts(rt.validator.vocab_size, 1, 32)
rt.generate(prompts[0], max_new_tokens=4)
res = [concurrent(rt, prompts, 128) for _ in range(3)]
step = direct_step_ms(rt, 64, steps=20, batch=1)
print(sys.argv[1].rsplit("/", 1)[1], "tok/s", " ".join(f"{r['tokens_per_s']:.1f}" for r in res), "itl p50", " ".join(f"{r['itl_p50_ms']:.2f}" for r in res), f"step {step:.2f}", flush=True)
