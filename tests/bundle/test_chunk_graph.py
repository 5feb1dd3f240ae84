"""The chunk graph in a bundle: `--chunk-graph 4` compiles a graph that writes 4 prompt tokens of one row
into the shared cache (no lm_head), checked at export and shown by `inspect`. Through it, text prompts go
in a call per 4 tokens, whole or in chunks beside decoding streams, past the sliding window, and greedy
tokens and logits equal HF `generate`; bad chunk inputs are refused before native code runs. The same
paths over the eager step, with pieces off the grid and at the cache's end: tests/unit/test_chunk_calls.py.
"""

from __future__ import annotations

import pytest
import torch
from helpers import GREEDY, SAMPLED, assert_each_matches_lone_generate, collected, staggered, submitter

from runtime.errors import InvalidInputError

NAME = "tiny-gemma3"  # sliding window 8 beside full layers
C = 4
OPTIONS = ("--gemv", "aten", "--chunk-graph", str(C))


@pytest.fixture(scope="module")
def rt(runtime):
    return runtime(NAME, *OPTIONS)


@pytest.fixture
def calls(rt, monkeypatch):
    """The start index of every call of the compiled chunk graph during the test."""
    seen, original = [], rt.decode.chunk

    def chunk(input_ids, position_ids, cache_position, pad_mask, kv):
        seen.append(int(cache_position[0]))
        return original(input_ids, position_ids, cache_position, pad_mask, kv)

    monkeypatch.setattr(rt.decode, "chunk", chunk)
    return seen


def _prompt(n: int, seed: int) -> dict:
    return {"input_ids": torch.randint(3, 300, (1, n), generator=torch.Generator().manual_seed(seed))}


def test_the_bundle_has_a_chunk_graph_checked_at_export_and_rings_with_room_for_it(rt, bundle, capsys):
    from exporter.cli import main

    m = rt.manifest
    (chunk,) = [g for g in m.graphs if g.chunk]
    assert m.chunk_tokens == C and (chunk.batch, chunk.tokens) == (1, C) and m.batches == (4,)
    assert chunk.parity.tokens_match and chunk.parity.steps > 0
    assert all(layer.slots == layer.window + C - 1 for layer in m.cache_layout if layer.window)
    assert main(["inspect", str(bundle(NAME, *OPTIONS))]) == 0
    assert f"chunk ({C} prompt tokens of one row" in capsys.readouterr().out


@pytest.mark.parametrize("length", [6, 30])
def test_whole_prompts_go_in_through_the_compiled_chunk_graph_and_equal_hf(rt, calls, length):
    inputs = _prompt(length, length)
    results = [collected(rt.engine.submit(rt.request(inputs["input_ids"], **GREEDY), want_logits=True))]
    assert_each_matches_lone_generate(rt.model, [(inputs, GREEDY, None)], results)
    assert calls == list(range(0, length - 1, C))


def test_a_long_prompt_admitted_in_chunks_beside_decoding_streams_equals_hf(rt, calls):
    rt.engine.chunk_prefills(6)
    try:
        plan = [(_prompt(5, 1), GREEDY, None), (_prompt(5, 2), SAMPLED, 3), (_prompt(40, 4), GREEDY, None)]
        results = staggered(submitter(rt), plan)
    finally:
        rt.engine.chunk_prefills(None)
    assert_each_matches_lone_generate(rt.model, plan, results)
    pieces = [range(s, min(s + 6, 39), C) for s in range(0, 39, 6)]
    assert calls == [0, 0, *(s for p in pieces for s in p)]


def test_bad_chunk_inputs_are_refused_before_native_code_runs(rt):
    kv = [torch.zeros_like(t[:1]) for t in rt.engine.runner.kv]
    ids, positions, mask = (
        torch.zeros(1, C, dtype=torch.long),
        torch.arange(C)[None],
        torch.ones(1, 8, dtype=torch.bool),
    )
    with pytest.raises(InvalidInputError, match=f"chunk graph takes {C}"):
        rt.decode.chunk(ids[:, :3], positions[:, :3], torch.tensor([0]), mask, kv)
    with pytest.raises(InvalidInputError, match="got 2 rows"):
        two = [torch.zeros_like(t[:2]) for t in rt.engine.runner.kv]
        rt.decode.chunk(ids.repeat(2, 1), positions.repeat(2, 1), torch.tensor([0, 0]), mask.repeat(2, 1), two)
    with pytest.raises(InvalidInputError, match="outside the attended span"):
        rt.decode.chunk(ids, positions + 6, torch.tensor([6]), mask, kv)
    with pytest.raises(InvalidInputError, match="has dtype"):
        rt.decode.chunk(ids, positions, torch.tensor([0]), mask, [t.half() for t in kv])
