"""Random mixes of requests through the engine, in seconds (the eager decode step, no compile): every
request's tokens and logits must equal a lone HF `generate` of it, whatever else ran.

Each seed draws the engine's configuration (whole or chunked prompts, which batch graphs exist, whether
prompts go in through a chunk graph of 3 or 4 tokens, its last call padded) and a
sequence of waves: requests admitted together, whose prompts share prefixes with each other and with
finished requests (the prefix cache copies, trades and takes over their rows), arriving while earlier
waves decode. A bug in how rows are moved, copied, parked or stepped shows as a request whose tokens
differ from its lone run: `aotpack serve` answered wrongly after a copied prefix waited for its first
chunk, which no single-scenario test had reached.
"""

from __future__ import annotations

import random

import pytest
import torch
from helpers import assert_each_matches_lone_generate, collected

ROWS, CACHE = 4, 96
BATCHES = [(4,), (1, 4), (1, 2, 3, 4)]  # one graph for every row, and batch buckets


def _draw(rng: random.Random, vocab: int):
    """Waves of (prompt (1, S), options): prompts from two stems (the shared part), a stem alone, or
    a stem's head with a tail of its own; 1 to 10 new tokens. Ids from 8 up: past every special token's
    (HF's generate masks a pad id inside a prompt it gets no mask for)."""
    stems = [torch.tensor([rng.randrange(8, vocab) for _ in range(rng.randint(4, 12))]) for _ in range(2)]
    waves = []
    for _ in range(rng.randint(3, 5)):
        wave = []
        for _ in range(rng.randint(1, 4)):
            stem = rng.choice(stems)[: rng.randint(1, 12)]
            tail = torch.tensor([rng.randrange(8, vocab) for _ in range(rng.randint(0, 9))], dtype=torch.long)
            new = rng.randint(1, 10)
            options = {"max_new_tokens": new, "min_new_tokens": new, "do_sample": False}
            wave.append((torch.cat([stem, tail]).reshape(1, -1), options))
        waves.append(wave)
    return waves


def _run(rt, waves, rng: random.Random):
    """Each wave admitted together once every request of the last has produced a token (or, by a coin,
    once they have all ended); returns [(ids, options, (tokens, logits))] in submission order."""
    started = []  # (ids, options, head steps, iterator)
    for wave in waves:
        if started and rng.random() < 0.3:
            started = [(i, o, head + list(steps), iter(())) for i, o, head, steps in started]  # all end first
        with rt.engine.together():
            handles = [(ids, options, rt.submit(ids, want_logits=True, **options)) for ids, options in wave]
        for ids, options, handle in handles:
            steps = iter(handle)
            started.append((ids, options, [next(steps)], steps))
    return [(ids, options, collected(head + list(steps))) for ids, options, head, steps in started]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
@pytest.mark.parametrize("seed", range(12))
def test_random_waves_over_kept_prefixes_each_match_a_lone_generate(eager_runtime, name, seed):
    rng = random.Random(seed)
    chunk = rng.choice([None, 2, 3, 5])
    graph = random.Random(1000 + seed).choice([0, 3, 4])  # a chunk graph of C tokens (its own draw)
    rt = eager_runtime(name, ROWS, CACHE, chunk=graph, prefill_chunk=chunk)
    rt.decode.batches = rng.choice(BATCHES)
    waves = _draw(rng, min(rt.validator.vocab_size, 300))
    results = _run(rt, waves, rng)
    plan = [({"input_ids": ids}, options, None) for ids, options, _ in results]
    assert_each_matches_lone_generate(rt.model, plan, [result for _, _, result in results])
