"""One copy of the weights, one KV cache: the compiled decode borrows the eager model's parameters
and continues from what the eager prefill wrote."""

from __future__ import annotations

import torch

from runtime.backends.checks import lend_constants
from runtime.model.positions import prompt_positions
from runtime.model.prefill import prefill


def _prefilled(rt, ids):
    mask = torch.ones_like(ids)
    kv = [t[: ids.shape[0]] for t in rt.kv]
    logits = prefill(rt.model, kv, rt.layout, ids, mask, prompt_positions(mask))
    pad_mask = torch.zeros(ids.shape[0], rt.manifest.max_cache_len, dtype=torch.bool)
    pad_mask[:, : ids.shape[1] + 1] = True
    return logits, kv, pad_mask


def _decode(rt, token, seq, pad_mask, kv):
    position = torch.full((token.shape[0], 1), seq)
    return rt.decode(token[:, None], position, torch.tensor([seq]), pad_mask, kv)


@torch.inference_mode()
def test_decode_borrows_eager_parameter_storage(runtime):
    rt = runtime("tiny-llama")
    lent = lend_constants(rt.model, rt.manifest.constants, rt.manifest.device)
    params = {p.data_ptr() for p in rt.model.parameters()}
    assert lent and all(t.data_ptr() in params for t in lent.values())
    # An in-place change to an eager parameter changes the compiled output: the .so holds no copy.
    ids = torch.tensor([[5, 9, 30, 41, 7]])
    logits, kv, pad_mask = _prefilled(rt, ids)
    token = logits.argmax(-1)
    before = _decode(rt, token, ids.shape[1], pad_mask, kv)
    weight = rt.model.lm_head.weight
    weight.mul_(2)
    try:
        doubled = _decode(rt, token, ids.shape[1], pad_mask, kv)
    finally:
        weight.div_(2)
    torch.testing.assert_close(doubled, 2 * before)
    torch.testing.assert_close(_decode(rt, token, ids.shape[1], pad_mask, kv), before)


@torch.inference_mode()
def test_decode_reads_the_cache_eager_prefill_wrote(runtime):
    rt = runtime("tiny-gemma3")
    ids = torch.tensor([[5, 9, 30, 41, 7, 12, 3, 90, 101, 4, 77]])  # longer than the window of 8
    logits, kv, pad_mask = _prefilled(rt, ids)
    token = logits.argmax(-1)
    compiled = _decode(rt, token, ids.shape[1], pad_mask, kv)
    eager = rt.model(input_ids=torch.cat([ids, token[:, None]], 1)).logits[:, -1]
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=0)
    for t in kv:  # forget what prefill wrote
        t.zero_()
    assert (_decode(rt, token, ids.shape[1], pad_mask, kv) - eager).abs().max() > 1e-2


def test_sliding_layers_allocate_window_slots(runtime):
    for name in ("tiny-gemma3", "tiny-mistral", "tiny-gemma3-vlm"):
        rt = runtime(name)
        for i, layer in enumerate(rt.layout):
            keys, values = rt.kv[2 * i], rt.kv[2 * i + 1]
            expected = 8 if layer.kind == "sliding_attention" else rt.manifest.max_cache_len
            assert layer.slots == expected
            assert keys.shape[2] == values.shape[2] == expected + 1 == layer.allocated  # and the spare slot
        assert any(layer.kind == "sliding_attention" for layer in rt.layout)
