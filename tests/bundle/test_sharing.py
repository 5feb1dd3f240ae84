"""One copy of the weights, one KV cache: the compiled decode borrows the eager model's parameters
and continues from what the eager prefill wrote."""

from __future__ import annotations

import torch
from helpers import prefilled_step

from runtime.backends.checks import lend_constants


@torch.inference_mode()
def test_decode_borrows_eager_parameter_storage(runtime):
    rt = runtime("tiny-llama")
    lent = lend_constants(rt.model, rt.manifest.constants, rt.manifest.device)
    params = {p.data_ptr() for p in rt.model.parameters()}
    assert lent and all(t.data_ptr() in params for t in lent.values())
    # An in-place change to an eager parameter changes the compiled output: the .so holds no copy.
    ids = torch.tensor([[5, 9, 30, 41, 7]])
    (token, position, index, pad_mask, kv), _ = prefilled_step(rt, ids)
    before = rt.decode(token, position, index, pad_mask, [t.clone() for t in kv])
    weight = rt.model.lm_head.weight
    weight.mul_(2)
    try:
        doubled = rt.decode(token, position, index, pad_mask, [t.clone() for t in kv])
    finally:
        weight.div_(2)
    torch.testing.assert_close(doubled, 2 * before)
    torch.testing.assert_close(rt.decode(token, position, index, pad_mask, [t.clone() for t in kv]), before)


@torch.inference_mode()
def test_decode_reads_the_cache_eager_prefill_wrote(runtime):
    rt = runtime("tiny-gemma3")
    ids = torch.tensor([[5, 9, 30, 41, 7, 12, 3, 90, 101, 4, 77]])  # longer than the window of 8
    (token, position, index, pad_mask, kv), _ = prefilled_step(rt, ids)
    compiled = rt.decode(token, position, index, pad_mask, [t.clone() for t in kv])  # (rows, vocab)
    eager = rt.model(input_ids=torch.cat([ids, token[:1]], 1)).logits[:, -1]  # (1, vocab)
    torch.testing.assert_close(compiled, eager.expand_as(compiled), atol=1e-4, rtol=0)
    for t in kv:  # forget what prefill wrote
        t.zero_()
    assert (rt.decode(token, position, index, pad_mask, kv) - eager).abs().max() > 1e-2


def test_sliding_layers_allocate_window_slots(runtime):
    for name in ("tiny-gemma3", "tiny-mistral", "tiny-gemma3-vlm"):
        rt = runtime(name)
        for i, layer in enumerate(rt.layout):
            keys, values = rt.kv[2 * i], rt.kv[2 * i + 1]
            expected = 8 if layer.kind == "sliding_attention" else rt.manifest.max_cache_len
            assert layer.slots == expected
            assert keys.shape[2] == values.shape[2] == expected + 1 == layer.allocated  # and the spare slot
        assert any(layer.kind == "sliding_attention" for layer in rt.layout)
