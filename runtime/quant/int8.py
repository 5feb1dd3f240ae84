"""int8 weight-only quantization (the inductor family): symmetric, one fp32 scale per row.

Owns the whole scheme: packing a float weight, unpacking, the eager op the prefill runs
(`aotpack::woq_linear_int8`) and the decode lowerings the exporter times.

Layout, chosen for the decode kernels: `words` (rows, cols/4); byte j of word c holds column
`j * cols/4 + c` (planar by quarters), signed. The words are float32-typed tensors holding integer
bits (runtime.quant): a kernel loads a vector of words and shifts each byte out.
"""

from __future__ import annotations

import torch

from runtime.format.quant import INDUCTOR, INT8, QuantSpec
from runtime.quant.kernels import activations, as_int32, each_row, flat, realized, rows_outer
from runtime.quant.scheme import Scheme, dequantized_linear, pack_words, product_like

_TINY = torch.finfo(torch.float32).tiny  # keeps an all-zero row's scale finite


def grid(spec: QuantSpec | None, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A float (rows, cols) weight -> (integers (rows, cols) in -127..127, scales (rows,) fp32): the
    row's largest magnitude maps to 127. Both int8 families share it."""
    w = weight.detach().float().cpu()
    scales = w.abs().amax(1).clamp(min=_TINY) / 127  # (rows,)
    return torch.round(w / scales[:, None]).clamp(-127, 127), scales


def arrange(q: torch.Tensor) -> torch.Tensor:
    """integers (rows, cols) -> words (rows, cols/4): byte j of word c holds column j*cols/4 + c."""
    rows, cols = q.shape
    return pack_words(q.view(rows, 4, cols // 4).transpose(1, 2))


def unpack(words: torch.Tensor) -> torch.Tensor:
    """words (R, W) -> the integers (R, 4W) in column order, int32: byte j of word c is column j*W + c,
    shifted to the top and sign-extended down."""
    w = as_int32(words)  # (R, W)
    shifts = (24 - 8 * torch.arange(4, dtype=torch.int32, device=w.device))[:, None]  # (4, 1)
    return ((w[:, None, :] << shifts) >> 24).reshape(w.shape[0], -1)  # (R, 4, W) -> (R, 4W)


def dequantize(spec: QuantSpec, words, scales) -> torch.Tensor:
    return unpack(words).float() * scales.float()[:, None]  # (R, cols)


@torch.library.custom_op("aotpack::woq_linear_int8", mutates_args=())
def woq_linear_int8(x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return dequantized_linear(x, QuantSpec(INT8, None, INDUCTOR), dequantize, (words, scales))


woq_linear_int8.register_fake(product_like)


def _byte_planes(words: torch.Tensor) -> torch.Tensor:
    """int32 words (..., 1, c) -> their 4 bytes as sign-extended fp32 (..., 4, c), byte j in plane j."""
    shifts = (24 - 8 * torch.arange(4, dtype=torch.int32, device=words.device))[:, None]  # (4, 1): byte j to the top
    return ((words << shifts) >> 24).float()


def reduce_words(x, words, scales):
    """Each vector of 8 words is loaded (and bit-cast, which Inductor does through a stack buffer) once
    and split into its 4 byte planes, so x is permuted to match: word c's byte j multiplies
    x[j * K/4 + c]. With the planes outermost instead, every word was loaded and bit-cast 4 times
    (layer shapes read 11-16 GB/s against 14-21 here)."""
    rows, count = words.shape  # count = K / 4
    if count % 8:  # too few words for whole vectors of them: planes outermost
        return _planes_outer(x, words, scales)
    # realized only once permuted: one loop, not two. planes[b, c, j, i] = x[b, j*K/4 + 8c + i]
    planes = realized(flat(x).view(-1, 4, count // 8, 8).transpose(1, 2).contiguous())  # (B, K/32, 4, 8)
    q = _byte_planes(as_int32(words).view(rows, count // 8, 1, 8))  # (N, K/32, 4, 8)
    y = each_row(lambda row: (q * row).sum((-1, -2, -3)), planes)  # (N, B)
    return rows_outer(y * scales.float()[:, None], x)


def _planes_outer(x, words, scales):
    rows, count = words.shape
    x2 = activations(x).view(-1, 4, count)  # (B, 4, K/4): x[b, j * K/4 + c]
    q = _byte_planes(as_int32(words)[:, None, :])  # (N, 4, K/4)
    return rows_outer(each_row(lambda row: (q * row).sum((-1, -2)), x2) * scales.float()[:, None], x)


def reduce_bytes(x, words, scales):
    """The same bytes read as an int8 (N, K) matrix whose columns are in stored order, so x is permuted
    to match (stored column 4c + j is column j * K/4 + c). Fast where Inductor's int8 vector loads are
    (AVX-512); on AVX2 they go through a memcpy, and `reduce_words` wins."""
    rows, count = words.shape
    # (B, K) in stored column order, realized once permuted (one loop, as in reduce_words)
    permuted = realized(flat(x).view(-1, 4, count).transpose(1, 2).reshape(-1, 4 * count))
    q = words.view(torch.int8).view(rows, 4 * count).float()  # (N, K)
    return rows_outer(each_row(lambda row: (q * row).sum(-1), permuted) * scales.float()[:, None], x)


SCHEME = Scheme(
    method=INT8,
    kernels=INDUCTOR,
    tensors=("words", "scales"),
    dtypes=(torch.float32, torch.float32),
    fields=4,
    grid=grid,
    arrange=arrange,
    arrange_scales=None,
    dequantize=dequantize,
    op=torch.ops.aotpack.woq_linear_int8.default,
    candidates={"reduce-words": reduce_words, "reduce-bytes": reduce_bytes},
)
