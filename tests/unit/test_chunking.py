"""Prefill chunks sized to a time budget (runtime.engine.chunking): pure arithmetic, no model."""

import math

import pytest

from runtime.config import LoadConfig
from runtime.engine.chunking import MIN_CHUNK, ChunkSizer
from runtime.errors import InvalidInputError


def test_without_a_budget_every_chunk_is_the_token_count():
    sizer = ChunkSizer(32, None)
    sizer.timed(32, 5.0)
    assert sizer.size(0.01) == 32
    assert ChunkSizer(None, None).size(0.01) is None  # whole prompts


def test_the_first_chunk_is_the_smallest_and_an_unmeasured_step_takes_the_largest():
    assert ChunkSizer(64, 1.5).size(0.02) == MIN_CHUNK  # nothing prefilled yet: from below
    sizer = ChunkSizer(64, 1.5)
    sizer.timed(32, 0.064)
    assert sizer.size(None) == 64  # the running requests' step not timed yet (no one decodes: chunks are solo)


def test_a_chunk_is_scaled_by_the_budget_over_what_the_last_one_took_and_cut_below_it_when_over():
    sizer = ChunkSizer(64, 1.5)
    sizer.timed(15, 0.010)
    assert sizer.size(0.020) == 45  # 1.5 steps of 20 ms = 30 ms: 15 * 30 / 10
    sizer.timed(40, 0.060)
    assert sizer.size(0.020) == 10  # over the budget: 40 * (30 / 60) ** 2, under what 40 * 30 / 60 would be


def test_chunks_stay_within_the_smallest_and_the_largest():
    sizer = ChunkSizer(64, 1.5)
    sizer.timed(32, 10.0)  # far slower than any budget
    assert sizer.size(0.02) == MIN_CHUNK
    sizer.timed(8, 1e-6)  # far faster
    assert sizer.size(0.02) == 64
    small = ChunkSizer(4, 1.0)  # a largest chunk under MIN_CHUNK is still the largest
    small.timed(4, 10.0)
    assert small.size(0.02) == 4


@pytest.mark.parametrize(("fixed", "per_token", "expected"), [(0.018, 0.0008, 15), (0.002, 0.001, 28)])
def test_chunk_sizes_converge_to_the_size_that_takes_the_budget_from_below(fixed, per_token, expected):
    """A chunk costs a + b * tokens (Gemma 3 270M int8: about 18 ms + 0.8 ms a token); from the largest chunk,
    the sizes settle where a chunk takes about budget x step (1.5 x 20 ms = 30 ms), and after the first
    no chunk takes more than that."""
    sizer, size, step, took = ChunkSizer(64, 1.5), 64, 0.020, []
    for _ in range(12):
        took.append(fixed + per_token * size)
        sizer.timed(size, took[-1])
        size = sizer.size(step)
    assert abs(size - expected) <= 1
    assert fixed + per_token * size == pytest.approx(1.5 * step, rel=0.1)
    assert max(took[1:]) <= 1.5 * step * 1.001


def test_when_a_pass_alone_exceeds_the_budget_chunks_shrink_to_the_smallest():
    sizer, size = ChunkSizer(64, 1.0), 64
    for _ in range(6):
        sizer.timed(size, 0.030 + 0.001 * size)  # the fixed 30 ms alone exceed one 20 ms step
        size = sizer.size(0.020)
    assert size == MIN_CHUNK


@pytest.mark.parametrize("budget", [0, -1.0, math.nan, math.inf, True, "1.5"])
def test_a_budget_must_be_a_positive_number_of_steps(budget):
    with pytest.raises(InvalidInputError, match="prefill_budget must be a number of decode steps"):
        LoadConfig(prefill_chunk=64, prefill_budget=budget)


def test_a_budget_without_chunks_is_refused_naming_the_fix():
    with pytest.raises(InvalidInputError, match="set prefill_chunk too"):
        LoadConfig(prefill_budget=1.5)


def test_with_a_chunk_graph_budgeted_sizes_are_whole_multiples_of_its_tokens():
    """A chunk graph takes C tokens a call, so a budget's size is cut to a multiple of C, at least one C
    (and at most the largest chunk)."""
    sizer = ChunkSizer(64, 1.0, quantum=16)
    assert sizer.size(0.01) == 16  # nothing measured yet: one call
    for tokens, seconds, expected in ((16, 0.004, 32), (16, 0.002, 64), (48, 0.03, 16), (16, 0.0101, 16)):
        sizer.timed(tokens, seconds)
        assert sizer.size(0.01) == expected
    assert ChunkSizer(8, 1.0, (8, 0.001), quantum=16).size(0.01) == 8  # a largest chunk below C stays itself
