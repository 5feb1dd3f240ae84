"""The decode attention candidates (exporter.attention) compute SDPA's attention, grouped heads and
masks included, and the build-time choice times every candidate for half precision."""

from __future__ import annotations

import pytest
import torch

from exporter import attention


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", [attention.FLASH, attention.FLASH_FP32])
def test_each_candidate_computes_sdpas_attention(name, dtype):
    torch.manual_seed(0)
    q = torch.randn(2, 4, 1, 32).to(dtype)  # 4 query heads over 2 key/value heads
    k, v = (torch.randn(2, 2, 24, 32).to(dtype) for _ in range(2))
    mask = torch.rand(2, 1, 1, 24) > 0.3
    mask[..., 0] = True  # every row attends to something
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True, scale=0.2
    )  # (B, heads, 1, D)
    got, _ = attention.FUNCTIONS[name](None, q, k, v, mask, scaling=0.2)  # (B, 1, heads, D)
    assert got.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.transpose(1, 2).float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.slow
def test_half_precision_bundles_time_every_candidate_and_keep_the_fastest(checkpoint):
    from exporter.model import load_model

    model, kind = load_model(checkpoint("tiny-gemma3"), "bfloat16", "cpu")
    choice = attention.choose(model, "bfloat16", "cpu", kind, 64, {}, log=lambda _: None)
    assert set(choice.us_per_call) == {attention.SDPA, attention.FLASH, attention.FLASH_FP32}
    assert choice.chosen == min(choice.us_per_call, key=choice.us_per_call.get) and choice.span == 64
    assert attention.choose(model, "float32", "cpu", kind, 64, {}).chosen == attention.FLASH  # untimed
    assert attention.choose(model, "bfloat16", "cuda", kind, 64, {}) is None
