"""The decode step's attention kernel, chosen at build time for CPU bundles of SDPA models.

Owns: the candidates, timing them on the build machine in the bundle's dtype, and installing the
chosen one while the step is traced. The candidates:
- "sdpa": torch's scaled_dot_product_attention, as transformers calls it. Traced with a dynamic batch
  and span, it takes SDPA's math path, which Inductor generates as loops of its own.
- "flash": ATen's CPU flash kernel called directly, in the bundle's dtype.
- "flash-fp32": the same kernel in float32 over float32 copies of q, k and v, the result cast back.
  On CPUs without native bf16 arithmetic torch's bf16 attention ran 6-9x slower than its fp32 one
  (AMD EPYC, AVX2: 720 us against 76 per layer at 512 slots), so reading bf16 storage and computing in
  fp32 wins there; where bf16 is native (AVX512-BF16, AMX) it need not. Hence the timing.
- "grouped": the flash kernel with each key/value head's query heads (and a verify step's tokens) as
  the query rows of that one head. Called with the model's query heads, the flash kernel reads a
  key/value head once per query head: 4 times for Gemma 3's 4 query heads a KV head, which past L2 costs
  4x the bytes (float32, 2 threads, Intel Xeon, a layer: 429 against 165 us at 2,048 slots and 1 row,
  3,037 against 1,156 at 8 rows, 47 against 23 at 64 slots and 8 rows; 15 against 14 at 64 and 1).
- "native": aotpack's own kernel (runtime.quant.attention, exporter/csrc/attention.cpp) with grouped's
  query rows: it reads each key and value once for a head's rows without the copies MKL's GEMM makes of
  them inside the flash kernel, and splits the keys across threads where a step has fewer (row, KV head)
  pairs than threads (one row: the flash kernel ran it on one thread). Gemma 3 270M's shapes, float32, a
  layer, 2 threads, AMD EPYC Zen 5: 1 row 95 -> 36 us at 1,024 slots, 8 rows 496 -> 262 us; 8 rows at 97
  slots 54 -> 31 us. A candidate where the export has aotpack's kernels (CPU exports).
Every candidate computes the same attention up to summation order; the parity gate checks the winner.
Float32 bundles time flash, grouped and native (SDPA's math path is no candidate there: Inductor's loops made a
batch-8 float32 bundle of Gemma 3 270M step in 72 ms at batch 1 and 260 at batch 8, against 64 and 156
with the flash kernel, AMD EPYC, AVX2); half precision times all four. Each candidate is timed at one
row and at the bundle's batch, over TIMED_SPAN slots, and the least total wins. `--decode-attention`
takes one untimed instead.
The candidates are timed on keys and values that are not in the CPU's caches, as the step reads them: between
two calls of a layer's attention the step streams every weight. Timed on one set of keys called again and again
(hot), flash won SmolLM2-135M's int4 export at 1,024 slots (134 against 140 us) and its bundle then stepped in
9.6 ms at position 1,500 and 3.9 at 100, against 7.5 and 3.6 with native (AMD EPYC Zen 4, 2 threads);
cycling through 256 MiB of keys and values, native wins there (123 against 145 us a call at 1,024 slots).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from exporter import compat
from exporter.timing import interleaved_seconds
from runtime.compat import float_environment_kept
from runtime.format.manifest import NATIVE_ATTENTION, DecodeAttention
from runtime.quant import attention as native_attention

SDPA, FLASH, FLASH_FP32, GROUPED = "sdpa", "flash", "flash-fp32", "grouped"
NATIVE = NATIVE_ATTENTION  # "native"
KERNELS = (SDPA, FLASH, FLASH_FP32, GROUPED, NATIVE)  # --decode-attention's choices besides "auto" (exporter.names)
TIMED_SPAN = 1024  # cache indices the candidates attend to when timed (or the whole cache, if shorter)
COLD_BYTES = 256 << 20  # keys and values cycled through when timed: past any last-level cache these CPUs have
MOST_COPIES = 64  # copies of them at most (tiny models' caches would take thousands)


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


def grouped(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The flash kernel with each key/value head's G query heads (and a verify step's T tokens) as the
    G * T query rows of that one head, so each key and value is read once, not once a query head.
    query (B, H, T, D), key and value (B, KV, S, D) with H = KV * G (transformers' grouping: query head h
    reads key/value head h // G); the mask (B or 1, 1 or H, T, S)."""
    b, heads, t, d = query.shape
    kv = key.shape[1]
    g = heads // kv
    mask = _additive(attention_mask, query.dtype)
    if mask is not None:  # rows in (G, T) order, as the queries': (B', 1, T, S) repeated G times, or per head
        mask = mask.repeat(1, 1, g, 1) if mask.shape[1] == 1 else mask.reshape(mask.shape[0], kv, g * t, -1)
    out = compat.cpu_flash_attention(query.reshape(b, kv, g * t, d), key, value, mask, scaling)  # (B, KV, G*T, D)
    out = out.reshape(b, kv, g, t, d).permute(0, 3, 1, 2, 4)  # (B, T, KV, G, D): head kv * G + g
    return out.reshape(b, t, heads, d), None  # (B, T, H, D), as transformers' attention returns


def native(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """grouped's query rows through aotpack's kernel (runtime.quant.attention), which takes the boolean
    (B or 1, 1, T, S) masks transformers builds for SDPA; any other mask goes through grouped."""
    mask = attention_mask
    if mask is None or mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1:
        return grouped(module, query, key, value, attention_mask, dropout, scaling)
    b, heads, t, d = query.shape
    kv = key.shape[1]
    scale = scaling if scaling is not None else d**-0.5
    out = native_attention.OP(query.reshape(b, kv, heads // kv * t, d), key, value, mask, scale)
    out = out.reshape(b, kv, heads // kv, t, d).permute(0, 3, 1, 2, 4)  # (B, T, KV, G, D): head kv * G + g
    return out.reshape(b, t, heads, d), None  # (B, T, H, D)


FUNCTIONS = {FLASH: flash, FLASH_FP32: flash_fp32, GROUPED: grouped, NATIVE: native}  # SDPA: transformers' own


def choose(
    model, dtype: str, device: str, attention: str, max_cache_len: int, options: dict, log=print,
    batch: int = 1, kernel: str = "auto", native_kernels: bool = False,
):  # fmt: skip
    """The manifest's DecodeAttention: None where the model's own attention is kept (GPU bundles, models
    on eager attention); `kernel` untimed if one is named; else the candidates for `dtype` timed here at
    one row and at `batch` rows, the least total kept. `native_kernels`: aotpack's kernels are loaded
    (exporter.kernels.build), so their attention is a candidate."""
    if device != "cpu" or attention != "sdpa":
        return None
    if kernel != "auto":
        return DecodeAttention(kernel, {}, 0)
    span = min(max_cache_len, TIMED_SPAN)
    names = (FLASH, GROUPED, NATIVE) if dtype == "float32" else KERNELS
    names = names if native_kernels else tuple(n for n in names if n != NATIVE)
    batches = sorted({1, batch})
    examples = [_examples(model, getattr(torch, dtype), span, b) for b in batches]  # every candidate's inputs
    timed = {name: round(seconds * 1e6, 1) for name, seconds in _seconds(names, examples, options).items()}
    rows = " + ".join(f"{b} row{'s' * (b > 1)}" for b in batches)
    log(f"decode attention over {span} slots, {rows}: " + ", ".join(f"{k} {v:.0f} us" for k, v in timed.items()))
    return DecodeAttention(min(timed, key=timed.get), timed, span)


def installed(model, choice: DecodeAttention | None):
    """The chosen attention for the trace (transformers' SDPA needs nothing installed)."""
    if choice is None or choice.chosen == SDPA:
        return nullcontext()
    return compat.attention_installed(model, f"aotpack_{choice.chosen}", FUNCTIONS[choice.chosen])


def _examples(model, dtype: torch.dtype, span: int, batch: int) -> list[tuple]:
    """`batch` rows' decode queries over `span` cached keys each, of the model's attention shape: as many
    copies of the keys and values as make COLD_BYTES (MOST_COPIES at most), all with the same queries."""
    config = model.config.get_text_config()
    kv_heads, head_dim = compat.head_shapes(config)
    kv_heads = kv_heads[0] if isinstance(kv_heads, list) else kv_heads
    head_dim = head_dim[0] if isinstance(head_dim, list) else head_dim
    q = torch.randn(batch, config.num_attention_heads, 1, head_dim).to(dtype)
    k, v = (torch.randn(batch, kv_heads, span, head_dim).to(dtype) for _ in range(2))
    mask = torch.ones(batch, 1, 1, span, dtype=torch.bool)
    copies = min(MOST_COPIES, max(1, -(-COLD_BYTES // (2 * k.nbytes))))
    return [(q, k, v, mask)] + [(q, k.clone(), v.clone(), mask) for _ in range(copies - 1)]


def _seconds(names: tuple[str, ...], examples: list[list[tuple]], options: dict) -> dict[str, float]:
    """Each candidate's time a call over `examples` (_examples' for each batch), summed over the batches:
    compiled as the bundle compiles (dynamic shapes, its Inductor options), then timed interleaved
    (exporter.timing), each its fastest pass over a batch's copies, over their count. Timed one after
    another, a candidate that ran while the machine was busy lost: on a Zen 5 EPYC the native kernel timed
    873 us against grouped's 741 in one export and 475 against 763 alone."""
    scale = examples[0][0][0].shape[-1] ** -0.5
    torch.compiler.reset()
    compiled = {
        name: torch.compile(_candidate(name, scale), dynamic=True, fullgraph=True, options=options) for name in names
    }
    totals = dict.fromkeys(names, 0.0)
    with torch.inference_mode(), float_environment_kept():
        for copies in examples:
            passes = {name: _over(compiled[name], copies) for name in names}
            timed = interleaved_seconds(passes, threads=torch.get_num_threads())
            totals = {name: totals[name] + timed.best[name] / len(copies) for name in names}
    return totals


def _over(fn, copies: list[tuple]):
    """`fn` called on each copy in turn, as the step calls a layer's attention after another's."""

    def call():
        for args in copies:
            fn(*args)

    return call


def _candidate(name: str, scale: float):
    """The candidate as a function of (q, k, v, mask)."""
    if name == SDPA:
        return lambda q, k, v, m: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=m, enable_gqa=True, scale=scale
        )
    return lambda q, k, v, m, _f=FUNCTIONS[name]: _f(None, q, k, v, m, scaling=scale)[0]
