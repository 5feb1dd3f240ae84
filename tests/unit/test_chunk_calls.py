"""Prompts through a chunk graph, in seconds: the engine over the eager backend, whose `chunk` runs the very
module the exporter traces for `--chunk-graph C` (the decode step without its lm_head) as it is.

Text prompts go into the cache C tokens a call, the last call padded past the prompt; what a padded call
writes beyond it must be overwritten before anything reads it, on full layers and on rings C - 1 slots
wider than their window. Each request must produce exactly what a lone HF `generate` produces for it:
whole prompts, chunked admissions beside a decoding stream, past the sliding window, and pieces that
start off the C grid or at the cache's end (those go in eagerly). The compiled graph repeats the main
cases in tests/bundle/test_chunk_graph.py.
"""

from __future__ import annotations

import functools

import pytest
import torch
from helpers import (
    GREEDY,
    SAMPLED,
    WholeWords,
    assert_each_matches_lone_generate,
    collected,
    lone_generate,
    staggered,
    submitter,
)

from runtime.errors import InvalidInputError

NAME = "tiny-gemma3"  # sliding window 8 beside full layers
C, ROWS, CACHE = 4, 4, 64


@pytest.fixture(scope="module")
def stand_in(eager_runtime):
    return functools.cache(lambda chunk=None: eager_runtime(NAME, ROWS, CACHE, chunk=C, prefill_chunk=chunk))


@pytest.fixture
def calls(stand_in, monkeypatch):
    """calls(rt) -> the list each of its chunk calls appends (the start index, its real tokens' mask) to."""

    def watch(rt):
        seen, decode = [], rt.decode
        original = decode.chunk

        def chunk(input_ids, position_ids, cache_position, pad_mask, kv):
            seen.append(int(cache_position[0]))
            return original(input_ids, position_ids, cache_position, pad_mask, kv)

        monkeypatch.setattr(decode, "chunk", chunk)
        return seen

    return watch


def _prompt(n: int, seed: int) -> dict:
    return {"input_ids": torch.randint(3, 300, (1, n), generator=torch.Generator().manual_seed(seed))}


@pytest.mark.parametrize("length", [2, 5, 6, 9, 30])
def test_whole_prompts_go_in_c_tokens_a_call_and_equal_hf(stand_in, calls, length):
    """Lengths on and off the grid (n - 1 tokens go in; the step takes the last): one call, a padded
    one, several, and past the window (30 tokens through an 8-token window, rings 11 slots wide)."""
    rt = stand_in()
    seen = calls(rt)
    inputs = _prompt(length, length)
    results = [collected(rt.engine.submit(rt.request(inputs["input_ids"], **GREEDY), want_logits=True))]
    assert_each_matches_lone_generate(rt.model, [(inputs, GREEDY, None)], results)
    assert seen == list(range(0, length - 1, C))


def test_a_long_prompt_admitted_in_chunks_beside_decoding_streams_equals_hf(stand_in, calls):
    """Chunks of 6 start off the grid (0, 6, 12, ...): each is its own calls, padded (C = 4: 0, 4 | 6,
    10 | ...), and the next chunk overwrites what the padding wrote; sampled and greedy streams decode
    meanwhile in the other rows."""
    rt = stand_in(6)
    seen = calls(rt)
    plan = [(_prompt(5, 1), GREEDY, None), (_prompt(5, 2), SAMPLED, 3), (_prompt(40, 4), GREEDY, None)]
    results = staggered(submitter(rt), plan)
    assert_each_matches_lone_generate(rt.model, plan, results)
    pieces = [range(s, min(s + 6, 39), C) for s in range(0, 39, 6)]
    assert seen == [0, 0, *(s for p in pieces for s in p)]  # the two short prompts, then the long one


def test_a_piece_the_cache_end_leaves_no_room_for_a_whole_call_goes_in_eagerly(stand_in, calls):
    """A 63-token prompt in a 64-slot cache, in chunks of 61: the first piece's last call starts at 60
    (60 + 4 = 64 slots), the second piece [61, 62) would write past the cache: it runs eagerly."""
    rt = stand_in(61)
    seen = calls(rt)
    inputs, options = _prompt(63, 7), {"max_new_tokens": 1, "do_sample": False}
    results = [collected(rt.engine.submit(rt.request(inputs["input_ids"], **options), want_logits=True))]
    assert_each_matches_lone_generate(rt.model, [(inputs, options, None)], results)
    assert seen == list(range(0, 61, C))


def test_left_padded_batches_and_copies_keep_their_own_paths(stand_in, calls):
    """A request of two left-padded prompts goes in eagerly (the chunk graph takes one row), and so does
    one row whose mask starts with zeros (its padding queries would see no key in the step); one prompt
    with num_return_sequences 2 goes in once, through the graph, and is copied (sampled, the same seed
    as HF's)."""
    rt = stand_in()
    seen = calls(rt)
    ids = torch.randint(3, 300, (2, 9), generator=torch.Generator().manual_seed(8))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    results = [collected(rt.engine.submit(rt.request(ids, mask, **GREEDY), want_logits=True))]
    assert_each_matches_lone_generate(rt.model, [(inputs, GREEDY, None)], results)
    padded = {"input_ids": ids[1:], "attention_mask": mask[1:]}  # one row, its mask starting with zeros
    results = [collected(rt.engine.submit(rt.request(ids[1:], mask[1:], **GREEDY), want_logits=True))]
    assert_each_matches_lone_generate(rt.model, [(padded, GREEDY, None)], results)
    assert seen == []
    one = _prompt(9, 9)
    copies = {"max_new_tokens": 8, "min_new_tokens": 8, "do_sample": True, "num_return_sequences": 2}
    expected, _ = lone_generate(rt.model, one, 7, **copies)
    torch.manual_seed(7)
    assert torch.equal(rt.generate(**one, **copies)[:, 9:], expected)
    assert seen == [0, 4]


def test_bad_chunk_inputs_are_refused_before_the_step_runs(stand_in):
    rt = stand_in()
    kv = [t[:1] for t in rt.engine.runner.kv]
    ids, positions = torch.zeros(1, C, dtype=torch.long), torch.arange(C)[None]
    mask = torch.ones(1, 8, dtype=torch.bool)
    with pytest.raises(InvalidInputError, match="chunk graph takes 4"):
        rt.decode.chunk(ids[:, :3], positions[:, :3], torch.tensor([0]), mask, kv)
    two = [t[:2] for t in rt.engine.runner.kv]
    with pytest.raises(InvalidInputError, match="one row's prompt tokens; got 2 rows"):
        rt.decode.chunk(ids.repeat(2, 1), positions.repeat(2, 1), torch.tensor([0, 0]), mask.repeat(2, 1), two)
    with pytest.raises(InvalidInputError, match="outside the attended span"):
        rt.decode.chunk(ids, positions + 6, torch.tensor([6]), mask, kv)


def test_a_vlm_session_continues_through_its_text_decoders_chunk_step(eager_runtime, calls):
    """The VLM's chunk step is its text decoder alone. A session's turn 2 continues the cache (a text
    piece after an image turn) through it and equals HF generate over the whole conversation; the image
    turn, whose prompt carries pixels and per-token inputs, went in eagerly."""
    from PIL import Image

    rt = eager_runtime("tiny-gemma3-vlm", ROWS, 160, chunk=C)
    seen = calls(rt)
    options = {"max_new_tokens": 6, "do_sample": False}
    with rt.session() as session:
        image = Image.new("RGB", (40, 30), (200, 120, 30))
        session.send("Describe it.", images=[image], logits_processor=[WholeWords(rt.tokenizer)], **options)
        assert seen == []
        held = session.last.prompt_tokens + session.last.new_tokens - 1
        reply = session.send("What colour is it, and why is it that colour today?", **options)
        inputs = rt.processor.apply_chat_template(
            session.messages[:-1], add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
        )
    ids = rt.model.generate(**inputs, **options)
    assert reply == rt.tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert session.last.reused == held and seen == list(range(held, session.last.prompt_tokens - 1, C))


def test_drafting_rows_and_chunked_prompts_share_the_rings_and_each_matches_hf(eager_runtime, calls):
    """Speculation (k = 2) and a chunk graph (C = 4) in one bundle: rings are window + max(k, C - 1) wide.
    A drafting request decodes (its prompt repeats, so prompt lookup drafts) while a long prompt goes in
    in chunks of 6 through the graph, past the window; both equal a lone generate."""
    rt = eager_runtime(NAME, ROWS, CACHE, drafts=2, chunk=C, prefill_chunk=6)
    seen = calls(rt)
    assert all(layer.slots == layer.window + C - 1 for layer in rt.contract.layout if layer.window)
    repeating = {"input_ids": torch.tensor([[5, 6, 7, 8, 9] * 3])}
    long = GREEDY | {"max_new_tokens": 30, "min_new_tokens": 30}
    plan = [(repeating, long, None), (_prompt(40, 11), GREEDY, None)]
    assert_each_matches_lone_generate(rt.model, plan, staggered(submitter(rt), plan))
    assert rt.engine.drafted > 0 and len(seen) > 7
