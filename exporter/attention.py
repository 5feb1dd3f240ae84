"""The decode step's attention kernel, chosen at build time for CPU bundles of SDPA models.

Owns: the candidates, timing them on the build machine in the bundle's dtype, and installing the
chosen one while the step is traced. The candidates:
- "sdpa": torch's scaled_dot_product_attention, as transformers calls it. Traced with a dynamic batch
  and span, it takes SDPA's math path, which Inductor generates as loops of its own.
- "flash": ATen's CPU flash kernel called directly, in the bundle's dtype. For float32 bundles it is
  taken untimed: with the math path a batch-8 float32 bundle of Gemma 3 270M stepped in 72 ms at batch 1
  and 260 at batch 8, with the flash kernel in 64 and 156 (AMD EPYC, AVX2).
- "flash-fp32": the same kernel in float32 over float32 copies of q, k and v, the result cast back.
  On CPUs without native bf16 arithmetic torch's bf16 attention ran 6-9x slower than its fp32 one
  (AMD EPYC, AVX2: 720 us against 76 per layer at 512 slots), so reading bf16 storage and computing in
  fp32 wins there; where bf16 is native (AVX512-BF16, AMX) it need not. Hence the timing.
Every candidate computes the same attention up to summation order; the parity gate checks the winner.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from exporter import compat
from exporter.timing import median_seconds
from runtime.compat import float_environment_kept
from runtime.format.manifest import DecodeAttention

SDPA, FLASH, FLASH_FP32 = "sdpa", "flash", "flash-fp32"
TIMED_SPAN = 1024  # cache indices the candidates attend to when timed (or the whole cache, if shorter)


def _additive(mask, dtype: torch.dtype):
    """A boolean mask as the flash kernel takes it: 0 where attended, -inf elsewhere (as SDPA does)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


def flash(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention signature over ATen's CPU flash kernel, in the inputs' dtype."""
    out = compat.cpu_flash_attention(query, key, value, _additive(attention_mask, query.dtype), scaling)
    return out.transpose(1, 2).contiguous(), None  # (B, q, heads, D), as transformers' attention returns


def flash_fp32(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The flash kernel in float32 over float32 copies of half-precision q, k and v."""
    mask = _additive(attention_mask, torch.float32)
    out = compat.cpu_flash_attention(query.float(), key.float(), value.float(), mask, scaling).to(query.dtype)
    return out.transpose(1, 2).contiguous(), None


FUNCTIONS = {FLASH: flash, FLASH_FP32: flash_fp32}  # SDPA: transformers' own


def choose(model, dtype: str, device: str, attention: str, max_cache_len: int, options: dict, log=print):
    """The manifest's DecodeAttention: None where the model's own attention is kept (GPU bundles, models
    on eager attention); "flash" for float32; for half precision, the fastest candidate on this machine."""
    if device != "cpu" or attention != "sdpa":
        return None
    if dtype == "float32":
        return DecodeAttention(FLASH, {}, 0)
    span = min(max_cache_len, TIMED_SPAN)
    args = _example(model, getattr(torch, dtype), span)
    timed = {name: round(_seconds(name, args, options) * 1e6, 1) for name in (SDPA, FLASH, FLASH_FP32)}
    log("decode attention over " + f"{span} slots: " + ", ".join(f"{k} {v:.0f} us" for k, v in timed.items()))
    return DecodeAttention(min(timed, key=timed.get), timed, span)


def installed(model, choice: DecodeAttention | None):
    """The chosen attention for the trace (transformers' SDPA needs nothing installed)."""
    if choice is None or choice.chosen == SDPA:
        return nullcontext()
    return compat.attention_installed(model, f"aotpack_{choice.chosen}", FUNCTIONS[choice.chosen])


def _example(model, dtype: torch.dtype, span: int) -> tuple:
    """One decode query over `span` cached keys of the model's attention shape (batch 1)."""
    config = model.config.get_text_config()
    kv_heads, head_dim = compat.head_shapes(config)
    kv_heads = kv_heads[0] if isinstance(kv_heads, list) else kv_heads
    head_dim = head_dim[0] if isinstance(head_dim, list) else head_dim
    q = torch.randn(1, config.num_attention_heads, 1, head_dim).to(dtype)
    k, v = (torch.randn(1, kv_heads, span, head_dim).to(dtype) for _ in range(2))
    return q, k, v, torch.ones(1, 1, 1, span, dtype=torch.bool)


def _seconds(name: str, args: tuple, options: dict) -> float:
    """One candidate's median call, compiled as the bundle compiles (dynamic shapes, its Inductor options)."""
    scale = args[0].shape[-1] ** -0.5
    if name == SDPA:

        def fn(q, k, v, m):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True, scale=scale)
    else:

        def fn(q, k, v, m, _f=FUNCTIONS[name]):
            return _f(None, q, k, v, m, scaling=scale)[0]

    torch.compiler.reset()
    compiled = torch.compile(fn, dynamic=True, fullgraph=True, options=options)
    with torch.inference_mode(), float_environment_kept():
        return median_seconds(compiled, *args, repeats=15)
