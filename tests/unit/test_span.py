"""Attention over the span in use: a decode step given the pad mask of cache indices [0, span) computes
exactly what it computes over the whole cache, whatever the rows hold: rows at different positions
(the furthest one sets the span), rings that wrapped and rings that did not, left padding, a session's
parked row. Run on the eager step (the module the exporter traces); tests/bundle/test_parity.py runs
the compiled one."""

from __future__ import annotations

import pytest
import torch

from exporter.model import cache_layout, load_model
from runtime.backends.checks import check_step_inputs
from runtime.errors import InvalidInputError
from runtime.format.contract import DecodeContract
from runtime.model.cache import allocate, attended_slots
from runtime.model.positions import RowPositions
from runtime.model.step import decode_step

CACHE = 64


@pytest.fixture(scope="module")
def gemma3(checkpoint):
    """tiny-gemma3: sliding window 8 beside full layers."""
    model, _ = load_model(checkpoint("tiny-gemma3"), "float32", "cpu")
    return model, cache_layout(model, CACHE)


def _rows(positions: list[int], pads: list[int]) -> RowPositions:
    """Rows whose prompts of `positions[i]` tokens (the first `pads[i]` of them padding) are in the cache."""
    rows = RowPositions(len(positions), CACHE, "cpu")
    for i, (fed, pad) in enumerate(zip(positions, pads, strict=True)):
        mask = torch.ones(1, fed + 1, dtype=torch.long)
        mask[:, :pad] = 0
        rows.place(slice(i, i + 1), mask, fed)
    rows.advance(torch.ones(len(positions), dtype=torch.bool))
    return rows


def _step(model, layout, rows: RowPositions, kv, span: int):
    position, index, _ = rows.inputs(len(kv[0]))
    pad = rows.pad_mask[:, :span].contiguous()
    tokens = torch.arange(3, 3 + position.shape[0])[:, None]
    with torch.inference_mode():
        return decode_step(model, layout)(tokens, position, index, pad, *kv)


@pytest.mark.parametrize(
    ("positions", "pads"),
    [
        ([5, 20, 40], [0, 3, 10]),  # the furthest row sets the span; rings of 8 wrapped in two rows
        ([2, 3, 5], [0, 1, 0]),  # the span is shorter than the ring: no ring wrapped
        ([7, 8, 9], [0, 0, 2]),  # around the window's edge
        ([0, 30, 63], [0, 0, 0]),  # an idle row at slot 0, a row at the cache's last index
    ],
)
def test_a_step_over_the_span_computes_what_a_step_over_the_whole_cache_computes(gemma3, positions, pads):
    model, layout = gemma3
    torch.manual_seed(0)
    rows = _rows(positions, pads)
    kv = [torch.randn(shape) for shape in DecodeContract(layout, 3, CACHE, "float32", "cpu").kv_shapes(3)]
    span = max(positions) + 1
    whole_kv, span_kv = [t.clone() for t in kv], [t.clone() for t in kv]
    whole = _step(model, layout, rows, whole_kv, CACHE)
    narrow = _step(model, layout, rows, span_kv, span)
    torch.testing.assert_close(narrow, whole, atol=1e-5, rtol=1e-5)
    for a, b in zip(whole_kv, span_kv, strict=True):  # the same slots written (rounding apart: the reductions
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)  # over 64 and over `span` slots differ in order)


def test_the_runner_passes_a_span_just_past_the_furthest_row():
    rows = _rows([4, 17, 9], [0, 0, 0])
    position, index, pad = rows.inputs(3)
    assert pad.shape == (3, 18) and pad.is_contiguous() and int(index.max()) == 17
    assert rows.inputs(1)[2].shape == (1, 5)  # only the rows stepped count


def test_a_ring_attends_to_all_its_slots_once_the_span_passes_it():
    from runtime.format.layout import FULL, SLIDING, LayerLayout

    ring, full = LayerLayout(SLIDING, 8, 8, 1, 4), LayerLayout(FULL, 64, None, 1, 4)
    assert [attended_slots(ring, s) for s in (1, 8, 9, 64)] == [1, 8, 8, 8]
    assert [attended_slots(full, s) for s in (1, 8, 9, 64)] == [1, 8, 9, 64]
    assert allocate((ring,), 2, torch.float32, "cpu")[0].shape == (2, 1, 9, 4)  # and one spare slot


def test_a_span_that_would_cut_a_row_is_refused_before_the_step(gemma3):
    _, layout = gemma3
    contract = DecodeContract(layout, 2, CACHE, "float32", "cpu")
    kv = allocate(layout, 2, torch.float32, "cpu")
    ids, position = torch.zeros(2, 1, dtype=torch.long), torch.zeros(2, 1, dtype=torch.long)
    index = torch.tensor([3, 12])
    check_step_inputs(contract, [ids, position, index, torch.ones(2, 13, dtype=torch.bool), *kv])
    with pytest.raises(InvalidInputError, match="cache_position 12 is outside the attended span 0..11"):
        check_step_inputs(contract, [ids, position, index, torch.ones(2, 12, dtype=torch.bool), *kv])
    with pytest.raises(InvalidInputError, match="its width, the attended span, must be 1..64"):
        check_step_inputs(contract, [ids, position, index, torch.ones(2, 65, dtype=torch.bool), *kv])


class _Work(torch.utils._python_dispatch.TorchDispatchMode):
    """Records each op that computes a new tensor, with its output shapes (views and in-place writes,
    whose outputs alias an input, cost nothing in proportion to their size and are left out)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves((args, kwargs)) if _dense(t)}
        outputs = [t for t in torch.utils._pytree.tree_leaves(out) if _dense(t)]
        if any(t.untyped_storage().data_ptr() not in inputs for t in outputs):
            self.ops.append((str(func), [tuple(t.shape) for t in outputs]))
        return out


def _dense(t) -> bool:
    return isinstance(t, torch.Tensor) and t.layout == torch.strided and t.numel() > 0


def _work(run) -> list:
    with _Work() as work:
        run()
    return work.ops


@pytest.mark.parametrize("cache", [256, 1024])
def test_the_steps_and_the_prefills_work_do_not_grow_with_the_cache(gemma3, checkpoint, cache):
    """The same rows, span and prompt in a 64-slot and a larger cache: every op that computes something
    computes the same shapes (so attention, masks and the KV write cost what the span costs), op for op."""
    from runtime.model.prefill import prefill_states

    model, small = gemma3
    large = cache_layout(model, cache)
    positions, pads = [5, 20, 40], [0, 3, 10]

    def step(layout, slots):
        rows = RowPositions(3, slots, "cpu")
        for i, (fed, pad) in enumerate(zip(positions, pads, strict=True)):
            mask = torch.ones(1, fed + 1, dtype=torch.long)
            mask[:, :pad] = 0
            rows.place(slice(i, i + 1), mask, fed)
        rows.advance(torch.ones(3, dtype=torch.bool))
        kv = allocate(layout, 3, torch.float32, "cpu")
        return lambda: _step(model, layout, rows, kv, max(positions) + 1)

    def prefill(layout):
        kv, ids = allocate(layout, 1, torch.float32, "cpu"), torch.arange(3, 33)[None]  # (1, 30): past the window
        mask = torch.ones_like(ids)
        return lambda: prefill_states(model, kv, layout, ids, mask, torch.arange(30)[None])

    assert _work(step(large, cache)) == _work(step(small, CACHE))
    assert _work(prefill(large)) == _work(prefill(small))


def test_a_batch_without_a_graph_is_refused_before_the_step(gemma3):
    """AOTInductor's graphs have a static batch: 3 rows on a bundle with graphs for 1, 4 and 8 would be
    misread by any of them, so the check names the graph to pad to and the export option."""
    _, layout = gemma3
    contract = DecodeContract(layout, 8, CACHE, "float32", "cpu")
    kv = allocate(layout, 3, torch.float32, "cpu")
    ids, position, index = torch.zeros(3, 1, dtype=torch.long), torch.zeros(3, 1, dtype=torch.long), torch.zeros(3)
    inputs = [ids, position, index.long(), torch.ones(3, 1, dtype=torch.bool), *kv]
    check_step_inputs(contract, inputs)  # a dynamic batch takes it
    with pytest.raises(InvalidInputError, match=r"batch 3 has no compiled graph .*\[1, 4, 8\].* step 4 rows"):
        check_step_inputs(contract, inputs, (1, 4, 8))
