"""int4 weight-only quantization (the inductor family): asymmetric, a bf16 scale and min per group of 32,
64 or 128 columns.

Owns the whole scheme: packing a float weight (min/max rounding), unpacking, the eager op the prefill
runs (`aotpack::woq_linear_int4`) and the decode lowering the exporter times. A weight's value is
`q * scale + min`.

Layout: `words` (rows, cols/8); nibble j of word c holds column `8c + j` (sequential), unsigned. A
kernel broadcasts each word to 8 lanes and splits it with per-lane shifts.
"""

from __future__ import annotations

import torch

from runtime.format.quant import INDUCTOR, INT4, QuantSpec
from runtime.quant.kernels import activations, as_int32, each_row, rows_outer
from runtime.quant.scheme import Scheme, dequantized_linear, pack_words, product_like

_TINY = torch.finfo(torch.float32).tiny
SCALE_DTYPE = torch.bfloat16  # scale and min per group: bf16 halves them


def grid(spec: QuantSpec, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A float (rows, cols) weight -> (integers (rows, cols) in 0..15, scales, mins (rows, groups) bf16),
    each group's range mapped onto 0..15. Both int4 families share it (the exporter may search better
    scales: exporter.scales)."""
    w = weight.detach().float().cpu()
    rows, cols = w.shape
    grouped = w.view(rows, cols // spec.group_size, spec.group_size)  # (rows, groups, gs)
    low, high = grouped.amin(-1), grouped.amax(-1)
    # Round scale and min to their stored dtype first, so the integers fit what is actually stored.
    scales = ((high - low) / 15).clamp(min=_TINY).to(SCALE_DTYPE)
    mins = low.to(SCALE_DTYPE)
    return integers(spec, w, scales, mins), scales, mins


def integers(spec: QuantSpec, weight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """The nearest of the 16 levels `q * scale + min` of each group, for a float (rows, cols) weight."""
    rows, cols = weight.shape
    grouped = weight.float().view(rows, cols // spec.group_size, spec.group_size)
    q = torch.round((grouped - mins.float()[..., None]) / scales.float()[..., None]).clamp(0, 15)
    return q.view(rows, cols)


def arrange(q: torch.Tensor) -> torch.Tensor:
    """integers (rows, cols) -> words (rows, cols/8): nibble j of word c holds column 8c + j."""
    rows, cols = q.shape
    return pack_words(q.view(rows, cols // 8, 8))


def unpack(words: torch.Tensor) -> torch.Tensor:
    """words (R, W) -> the integers (R, 8W) in column order, int32: nibble j of word c is column 8c + j."""
    w = as_int32(words)
    fields = torch.arange(8, dtype=torch.int32, device=w.device)
    return ((w[:, :, None] >> (4 * fields)) & 15).reshape(w.shape[0], -1)  # (R, W, 8) -> (R, 8W)


def dequantize(spec: QuantSpec, words, scales, mins) -> torch.Tensor:
    return values(spec, unpack(words), scales, mins)


def values(spec: QuantSpec, q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """integers (R, cols) -> the weight they stand for, fp32 (R, cols): q * scale + min per group."""
    grouped = q.float().view(q.shape[0], -1, spec.group_size)  # (R, groups, group_size)
    return (grouped * scales.float()[..., None] + mins.float()[..., None]).view(q.shape)


@torch.library.custom_op("aotpack::woq_linear_int4", mutates_args=())
def woq_linear_int4(
    x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, group_size: int
) -> torch.Tensor:
    return dequantized_linear(x, QuantSpec(INT4, group_size, INDUCTOR), dequantize, (words, scales, mins))


woq_linear_int4.register_fake(product_like)


def reduce_nibbles(x, words, scales, mins, group_size):
    rows, count = words.shape  # count = K / 8
    groups = 8 * count // group_size
    x2 = activations(x).view(-1, groups, group_size // 8, 8)  # (B, G, gs/8, 8)
    w = as_int32(words).view(rows, groups, group_size // 8, 1)  # one word feeds 8 lanes
    q = ((w >> (4 * torch.arange(8, dtype=torch.int32, device=x.device))) & 15).float()  # (N, G, gs/8, 8)
    dq = q * scales.float().view(rows, groups, 1, 1) + mins.float().view(rows, groups, 1, 1)
    return rows_outer(each_row(lambda row: (dq * row).sum((-1, -2, -3)), x2), x)


SCHEME = Scheme(
    method=INT4,
    kernels=INDUCTOR,
    tensors=("words", "scales", "mins"),
    dtypes=(torch.float32, SCALE_DTYPE, SCALE_DTYPE),
    fields=8,
    grid=grid,
    arrange=arrange,
    arrange_scales=None,
    dequantize=dequantize,
    op=torch.ops.aotpack.woq_linear_int4.default,
    candidates={"reduce-nibbles": reduce_nibbles},
    grouped=True,
)
