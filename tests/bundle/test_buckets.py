"""Batch buckets: a bundle with decode graphs for 1, 4 and 8 of its 8 rows, each with its own kernels.

Every graph is held to HF eager `generate` with as many rows as it serves (left-padded, past the sliding
window); the engine steps the smallest graph that covers the rows in use; and every graph reads the
one copy of the weights the eager model holds. The fused-reduction kernels (`--gemv reduce`) are the
ones whose code depends on the batch, so this bundle compiles them.
"""

from __future__ import annotations

import pytest
import torch
from helpers import (
    GREEDY,
    admitted_together,
    assert_each_matches_lone_generate,
    assert_parity,
    graphs_stepped,
    staggered,
    submitter,
)

from runtime.backends.checks import lend_constants
from runtime.model.positions import RowPositions

NAME = "tiny-gemma3"  # sliding window 8 beside full layers
BUCKETS = ("--gemv", "reduce", "--batch-size", "8", "--batch-buckets", "1,4,8")


@pytest.fixture(scope="module")
def rt(runtime):
    return runtime(NAME, *BUCKETS)


def _left_padded(rows: int) -> dict:
    """`rows` prompts of 6 to 6 + 3 (rows - 1) tokens, left-padded into one batch."""
    torch.manual_seed(rows)
    longest = 6 + 3 * (rows - 1)
    ids = torch.randint(3, 300, (rows, longest))
    mask = torch.ones_like(ids)
    for row in range(rows):
        mask[row, : 3 * (rows - 1 - row)] = 0
        ids[row, : 3 * (rows - 1 - row)] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _standing(rt, batch: int) -> tuple:
    """The step inputs (position_ids, cache_position, pad_mask) of `batch` rows that each hold 3 tokens."""
    rows = RowPositions(batch, rt.manifest.max_cache_len, "cpu")
    rows.place(slice(0, batch), torch.ones(batch, 4, dtype=torch.long), 3)
    rows.advance(torch.ones(batch, dtype=torch.bool))
    return rows.inputs(batch)


def test_the_bundle_has_a_graph_per_bucket_each_checked_at_its_batch(rt):
    assert rt.manifest.batches == (1, 4, 8)
    for graph in rt.manifest.graphs:
        assert graph.parity.tokens_match and graph.parity.steps > 0
        assert {lw.chosen for lw in graph.lowerings} == {"reduce"}


@pytest.mark.parametrize(("rows", "graph"), [(1, 1), (3, 4), (8, 8)])
def test_each_graph_matches_hf_past_the_window(rt, reference, rows, graph):
    """1 row steps the batch-1 graph, 3 rows the batch-4 one (with an idle row), 8 rows the batch-8 one:
    greedy tokens identical to HF and logits within 1e-4 over 40 tokens (5 windows)."""
    inputs = _left_padded(rows)
    assert rows == 1 or (inputs["attention_mask"] == 0).any()
    with graphs_stepped(rt) as stepped:
        assert_parity(rt, reference(NAME), inputs, new_tokens=40)
    assert set(stepped) == {graph}


def test_the_engine_steps_the_smallest_graph_covering_the_rows_in_use(rt, reference):
    """Requests join and leave: a request alone steps the batch-1 graph; six admitted together step the
    batch-8 one, the batch-4 one once four rows are left, the batch-1 one once one is; each request
    matches HF alone."""
    plan = [(_left_padded(1), GREEDY, None)]
    with graphs_stepped(rt) as stepped:
        assert_each_matches_lone_generate(reference(NAME), plan, staggered(submitter(rt), plan))
    assert set(stepped) == {1}
    lengths = (40, 32, 24, 20, 12, 8)  # row i ends first the higher i is: the rows in use stay 0..n-1
    plan = [({"input_ids": torch.randint(3, 300, (1, 5 + i))}, _new(n), None) for i, n in enumerate(lengths)]
    with graphs_stepped(rt) as stepped:
        assert_each_matches_lone_generate(reference(NAME), plan, admitted_together(rt.engine, submitter(rt), plan))
    widths = [8] * 12 + [4] * (32 - 12) + [1] * (40 - 32)  # a token a step (the prompt's last token's too)
    assert stepped == widths, [(w, stepped.count(w)) for w in (8, 4, 1)]


def _new(tokens: int) -> dict:
    return {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False}


@torch.inference_mode()
def test_every_graph_reads_the_one_copy_of_the_weights(rt):
    """Each graph is lent the eager model's own tensors: doubling the lm_head in place doubles every
    graph's logits, and nothing in the process holds a second copy."""
    lent = lend_constants(rt.model, rt.manifest.constants, rt.manifest.device)
    params = {p.data_ptr() for p in rt.model.parameters()}
    assert lent and all(t.data_ptr() in params for t in lent.values())
    weight = rt.model.lm_head.weight
    for batch in rt.manifest.batches:
        inputs = _standing(rt, batch)
        kv = [t[:batch].clone() for t in rt.kv]  # each call writes the same slot: start each from the same cache
        token = torch.full((batch, 1), 17)
        before = rt.decode(token, *inputs, [t.clone() for t in kv])
        weight.mul_(2)
        try:
            doubled = rt.decode(token, *inputs, [t.clone() for t in kv])
        finally:
            weight.div_(2)
        torch.testing.assert_close(doubled, 2 * before)


@torch.inference_mode()
def test_a_row_computes_the_same_logits_in_every_graph(rt):
    """Each row's sums run in the same order whichever graph steps it, so the same row in the batch-1,
    batch-4 and batch-8 graphs gives the same logits (to fp32 rounding of the attention)."""
    outputs = []
    for batch in rt.manifest.batches:
        kv = [torch.zeros_like(t[:batch]) for t in rt.kv]
        outputs.append(rt.decode(torch.full((batch, 1), 17), *_standing(rt, batch), kv)[0])
    for other in outputs[1:]:
        torch.testing.assert_close(other, outputs[0], atol=1e-5, rtol=0)
