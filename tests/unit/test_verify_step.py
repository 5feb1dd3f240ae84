"""The verify step (speculative decoding): one call over a row's next token and k drafted ones computes
what k + 1 single-token steps compute, and drafts it wrote but the engine rejected change nothing that
a later step reads, in full layers and in rings (which hold k slots beyond their window for that). Run
on the eager step, the module the exporter traces; tests/bundle/test_verify_graphs.py runs the compiled one."""

from __future__ import annotations

import pytest
import torch

from exporter.model import cache_layout, load_model
from runtime.model.cache import allocate
from runtime.model.positions import RowPositions
from runtime.model.prefill import prefill
from runtime.model.step import decode_step

CACHE, DRAFTS = 64, 3


@pytest.fixture(scope="module", params=["tiny-gemma3", "tiny-llama", "tiny-gemma2"])
def model(request, checkpoint):
    """Gemma 3 and Gemma 2 (eager attention, additive masks): windows of 8 beside full layers; Llama: full only."""
    model, _ = load_model(checkpoint(request.param), "float32", "cpu")
    return model, cache_layout(model, CACHE, DRAFTS)


def _prefilled(model, layout, prompt: int, rows: int = 2):
    """`rows` rows holding random prompts of `prompt` tokens, row 1 left-padded by 3; (kv, positions, ids)."""
    torch.manual_seed(prompt)
    ids = torch.randint(3, 200, (rows, prompt + 1))
    mask = torch.ones_like(ids)
    mask[1:, :3] = 0
    kv = allocate(layout, rows, torch.float32, "cpu")
    from runtime.model.positions import prompt_positions

    with torch.inference_mode():
        prefill(model, [t for t in kv], layout, ids[:, :-1], mask[:, :-1], prompt_positions(mask[:, :-1]))
    positions = RowPositions(rows, CACHE, "cpu")
    positions.place(slice(0, rows), mask, prompt)
    return kv, positions, ids[:, -1:]


def _decode(step, positions: RowPositions, kv, tokens):
    """Single-token steps over `tokens` (rows, n), one after another: logits (rows, n, vocab)."""
    out = []
    for t in range(tokens.shape[1]):
        positions.advance(torch.ones(tokens.shape[0], dtype=torch.bool))
        out.append(step(tokens[:, t : t + 1], *positions.inputs(tokens.shape[0]), *kv))
    return torch.stack(out, 1)


def _verify(step, positions: RowPositions, kv, tokens):
    """One verify call over `tokens` (rows, k + 1): logits (rows, k + 1, vocab); the rows' indices stay at
    their first token until `settle` says how many drafts were accepted."""
    rows, n = tokens.shape
    positions.advance(torch.ones(rows, dtype=torch.bool))
    positions.reach(slice(0, rows), n - 1)
    position, index, pad = positions.inputs(rows, n)
    return step(tokens, position, index, pad, *kv)


@pytest.mark.parametrize("prompt", [5, 20])  # before and after the rings of 8 (+3) wrap
@torch.inference_mode()
def test_one_verify_call_computes_what_single_steps_compute(model, prompt):
    model, layout = model
    step = decode_step(model, layout)
    kv, positions, last = _prefilled(model, layout, prompt)
    tokens = torch.cat([last, torch.randint(3, 200, (2, DRAFTS))], 1)  # (2, k + 1)
    kv2, positions2 = [t.clone() for t in kv], _copy(positions)
    expected = _decode(step, positions, kv, tokens)
    verified = _verify(step, positions2, kv2, tokens)
    assert verified.shape == expected.shape
    torch.testing.assert_close(verified, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("accepted", [0, 1, DRAFTS])
@pytest.mark.parametrize("prompt", [6, 25])
@torch.inference_mode()
def test_rejected_drafts_change_nothing_later_steps_read(model, prompt, accepted):
    """A verify call accepts `accepted` drafts; the rest were written to the cache. The steps after it
    compute exactly what they compute when those drafts were never written, past the window too."""
    model, layout = model
    step = decode_step(model, layout)
    kv, positions, last = _prefilled(model, layout, prompt)
    tokens = torch.cat([last, torch.randint(3, 200, (2, DRAFTS))], 1)
    kv2, positions2 = [t.clone() for t in kv], _copy(positions)
    _decode(step, positions, kv, tokens[:, : accepted + 1])  # the accepted tokens, one by one
    _verify(step, positions2, kv2, tokens)
    positions2.settle(slice(0, 2), accepted, DRAFTS)  # the rejected drafts go
    after = torch.randint(3, 200, (2, 12))  # more than the window: every ring slot is read again
    torch.testing.assert_close(
        _decode(step, positions2, kv2, after), _decode(step, positions, kv, after), atol=1e-4, rtol=1e-4
    )


def _copy(positions: RowPositions) -> RowPositions:
    copy = RowPositions(positions.index.shape[0], CACHE, "cpu")
    for name in ("pad_mask", "position", "index"):
        getattr(copy, name).copy_(getattr(positions, name))
    return copy
