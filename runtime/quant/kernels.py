"""Building blocks of the fused decode kernels: tensor expressions shaped so that Inductor turns each
linear layer into one reduction that reads every weight row once.

Owns the three tricks every lowering candidate shares (runtime.quant.int8, runtime.quant.int4, and the
float ones in exporter.lowering). They are plain torch: evaluated eagerly they compute the same
function, which the tests check against the eager ops.
"""

from __future__ import annotations

import torch


def realized(t: torch.Tensor) -> torch.Tensor:
    """`t` as a buffer of its own. Without the barrier, Inductor inlines the producer (e.g. the RMSNorm's
    scaling) into the reduction, where it is recomputed for every weight row: the lm_head then read at
    19 GB/s instead of 30. `as_strided` is lowered by realizing its input."""
    return torch.as_strided(t, t.shape, t.stride())


def flat(x: torch.Tensor) -> torch.Tensor:
    """x (..., K) as fp32 (B, K), not yet realized."""
    return x.reshape(-1, x.shape[-1]).float()


def activations(x: torch.Tensor) -> torch.Tensor:
    """x (..., K) as a realized fp32 (B, K) buffer, row-major: with B > 1 rows the previous layer's output
    is a transposed view (`rows_outer`), and realized as it was, Inductor tiled the next reduction across
    its outputs, transposing each 8x8 weight tile once per row (5 times in a verify graph's kernels)."""
    return realized(flat(x).contiguous())


def each_row(reduce, xs: torch.Tensor) -> torch.Tensor:
    """(N, B): `reduce(x)` (N,) for each activation row x of xs (B, ...). The decode graphs have a static
    batch, so this is B reductions over the same weight, which Inductor fuses into one kernel that loads
    (and converts or dequantizes) each weight vector once and multiplies it into one accumulator per
    row. Broadcasting xs against the weight instead made a loop over rows inside the weight's, which
    dequantized every weight vector once per row: an int8 lm_head read at batch 8 took 5.8x its batch-1
    time, against 1.8x fused. Each row's sum runs in the same order as at batch 1."""
    return torch.stack([reduce(xs[i]) for i in range(xs.shape[0])], 1)


def rows_outer(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(rows, B) fp32 -> x's leading shape + (rows,), in x's dtype. Every kernel keeps the weight rows
    outermost, so that a batch larger than one re-reads each weight row from L1 rather than the whole
    weight from memory."""
    return y.t().reshape(*x.shape[:-1], y.shape[0]).to(x.dtype)


def as_int32(words: torch.Tensor) -> torch.Tensor:
    """Packed words are stored as float32-typed tensors holding integer bits (runtime.quant): viewed,
    never converted."""
    return words.view(torch.int32)
