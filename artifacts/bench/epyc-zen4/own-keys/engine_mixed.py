"""8 greedy streams through the engine, one of them behind a long prompt: python engine_mixed.py BUNDLE LONG
(ab.txt). Prints the median step time (ms) between tokens of the short streams while all 8 decode, and tokens/s."""

import statistics
import sys
import threading
import time

import torch

from runtime import load

rt = load(sys.argv[1])
long = int(sys.argv[2])


def run(new=160):
    prompts = [torch.tensor([[2, *range(1000, 1000 + long - 1)]])] + [
        torch.tensor([[2, *range(100 + i, 131 + i)]]) for i in range(7)
    ]
    stamps = [[] for _ in prompts]

    def follow(h, i):
        for _ in h:
            stamps[i].append(time.perf_counter())

    handles = [rt.submit(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new) for ids in prompts]
    threads = [threading.Thread(target=follow, args=(h, i)) for i, h in enumerate(handles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    start = max(s[1] for s in stamps)  # all admitted and decoding
    end = min(s[-1] for s in stamps)
    gaps = [b - a for s in stamps[1:] for a, b in zip(s[:-1], s[1:], strict=True) if start <= a and b <= end]
    tokens = sum(sum(1 for t in s if start <= t <= end) for s in stamps)
    return statistics.median(gaps) * 1e3, tokens / (end - start)


run(16)
results = [run() for _ in range(2)]
figures = " ".join(f"{g:.2f}ms {r:.1f}tok/s" for g, r in results)
print(sys.argv[1].rsplit("/", 1)[-1], f"long={long}", figures, flush=True)
