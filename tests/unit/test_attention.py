"""The decode attention candidates (exporter.attention) compute SDPA's attention, grouped heads and
masks included, and the build-time choice times every candidate for half precision (aotpack's own where
the export has built its kernels)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from exporter import attention, kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", attention.KERNELS[1:])  # SDPA: transformers' own
@pytest.mark.parametrize("tokens", [1, 3])  # a decode step, a verify step's token and 2 drafts
def test_each_candidate_computes_sdpas_attention(name, dtype, tokens):
    if name == attention.NATIVE:
        kernels.build(log=lambda _: None)  # aotpack's kernels serve the eager op
    torch.manual_seed(0)
    q = torch.randn(2, 6, tokens, 32).to(dtype)  # 6 query heads over 2 key/value heads: 3 a group
    k, v = (torch.randn(2, 2, 24, 32).to(dtype) for _ in range(2))
    mask = torch.rand(2, 1, tokens, 24) > 0.3  # each row and token its own
    mask[..., 0] = True  # every row attends to something
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True, scale=0.2
    )  # (B, heads, T, D)
    got, _ = attention.FUNCTIONS[name](None, q, k, v, mask, scaling=0.2)  # (B, T, heads, D)
    assert got.dtype == dtype and got.shape == (2, tokens, 6, 32)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.transpose(1, 2).float(), expected, atol=tolerance, rtol=tolerance)


def test_grouped_takes_a_mask_per_head_and_none():
    """transformers may give a mask per query head, or none; the grouped candidate takes both as SDPA."""
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 2, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)
    mask = torch.rand(1, 4, 2, 9) > 0.4
    mask[..., 0] = True
    for m in (mask, None):
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
        got, _ = attention.grouped(None, q, k, v, m)  # scaling None: 1 / sqrt(D), as SDPA's default
        torch.testing.assert_close(got.transpose(1, 2), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("cold_bytes", "copies"), [(1, 1), (2 * 8192 * 5 - 1, 5), (1 << 40, attention.MOST_COPIES)])
def test_candidates_are_timed_over_keys_and_values_past_the_caches(monkeypatch, cold_bytes, copies):
    """A timed call cycles through copies of the keys and values (as the step reads a layer's cache after
    the weights streamed past it, not warm from the last call): COLD_BYTES of them, one copy at least,
    MOST_COPIES at most; each copy its own tensors, the queries and mask shared."""
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1)
    monkeypatch.setattr(attention, "COLD_BYTES", cold_bytes)
    examples = attention._examples(SimpleNamespace(config=config), torch.float32, 32, 2)  # k: 2*2*32*16*4 B
    assert len(examples) == copies
    q, k, v, mask = examples[0]
    assert q.shape == (2, 4, 1, 16) and k.shape == v.shape == (2, 2, 32, 16) and k.nbytes == 8192
    assert len({id(e[1]) for e in examples} | {id(e[2]) for e in examples}) == 2 * copies
    assert all(e[0] is q and e[3] is mask and torch.equal(e[1], k) for e in examples)


def test_a_candidates_time_is_its_pass_over_the_copies_over_their_count(monkeypatch):
    calls = []
    monkeypatch.setattr(attention.torch, "compile", lambda fn, **_: lambda *args: calls.append(args))
    monkeypatch.setattr(
        attention, "interleaved_seconds", lambda fns, threads: SimpleNamespace(best=dict.fromkeys(fns, 0.012))
    )
    copies = [(torch.zeros(1, 2, 1, 4), torch.zeros(1), torch.zeros(1), None)] * 3
    totals = attention._seconds((attention.FLASH, attention.NATIVE), [copies, copies[:1]], {})
    assert totals == pytest.approx({attention.FLASH: 0.004 + 0.012, attention.NATIVE: 0.004 + 0.012})


@pytest.mark.slow
def test_bundles_time_their_dtypes_candidates_at_one_row_and_their_batch_and_keep_the_fastest(checkpoint):
    from exporter.model import load_model

    model, kind = load_model(checkpoint("tiny-gemma3"), "bfloat16", "cpu")
    logged = []
    kernels.build(log=lambda _: None)
    choice = attention.choose(model, "bfloat16", "cpu", kind, 64, {}, log=logged.append, batch=4, native_kernels=True)
    assert set(choice.us_per_call) == set(attention.KERNELS)
    assert choice.chosen == min(choice.us_per_call, key=choice.us_per_call.get) and choice.span == 64
    assert "1 row + 4 rows" in logged[0]
    fp32 = attention.choose(model, "float32", "cpu", kind, 64, {}, log=lambda _: None)
    assert set(fp32.us_per_call) == {attention.FLASH, attention.GROUPED}  # SDPA's math path is no candidate
    # without aotpack's kernels (an export that builds none), theirs is no candidate
    named = attention.choose(model, "float32", "cpu", kind, 64, {}, kernel=attention.GROUPED)
    assert named.chosen == attention.GROUPED and named.us_per_call == {} and named.span == 0  # untimed
    assert attention.choose(model, "bfloat16", "cuda", kind, 64, {}) is None


def test_a_named_kernel_for_a_model_on_eager_attention_is_refused_before_compiling(checkpoint, tmp_path):
    """Gemma 2's soft-capped attention has no SDPA form, so no kernel replaces it: naming one is an error."""
    from exporter.config import ExportConfig
    from exporter.export import export
    from runtime.errors import ExportError

    config = ExportConfig(model=str(checkpoint("tiny-gemma2")), out=tmp_path / "b", decode_attention="grouped")
    with pytest.raises(ExportError, match="--decode-attention grouped replaces SDPA, and this model runs 'eager'"):
        export(config, log=lambda _: None)
    assert not (tmp_path / "b").exists()
