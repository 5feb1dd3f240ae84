"""What every weight-only quantization scheme provides, and the pieces they share.

Owns `Scheme`: a scheme's packed tensors, its packing and unpacking, its eager op (what the prefill
runs: `aotpack::woq_linear_<method>`), and the decode lowering candidates the exporter times and
compiles in its place. Each scheme is one module (runtime.quant.int8, runtime.quant.int4), registered
by name in runtime.quant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from runtime.format.quant import QuantSpec

_CHUNK_ELEMENTS = 1 << 20  # eager dequantization works through rows in blocks of about this many weights


@dataclass(frozen=True)
class Scheme:
    method: str
    tensors: tuple[str, ...]  # the packed weight's buffers, in the op's argument order
    scale_dtype: torch.dtype
    pack: Callable[..., tuple[torch.Tensor, ...]]  # (spec, float (rows, cols)) -> the tensors
    dequantize: Callable[..., torch.Tensor]  # (spec, *tensors) -> fp32 (rows, cols)
    op: Callable  # the eager op's overload: (x, *tensors, *op_extras(spec)) -> (..., rows)
    candidates: dict[str, Callable]  # decode lowerings: the op's signature, the same function
    grouped: bool = False  # scales (and mins) per group of columns, the group size an op argument

    def op_extras(self, spec: QuantSpec) -> tuple:
        return (spec.group_size,) if self.grouped else ()

    def spec_of(self, args: tuple) -> QuantSpec:
        """The spec of an op call's arguments, as a traced graph holds them."""
        return QuantSpec(self.method, args[1 + len(self.tensors)] if self.grouped else None)

    def scale_shape(self, spec: QuantSpec, rows: int, cols: int) -> tuple[int, ...]:
        return (rows, cols // spec.group_size) if self.grouped else (rows,)


def pack_words(q: torch.Tensor) -> torch.Tensor:
    """(rows, count, fields) small integers, field j of word c in bits [j*bits, (j+1)*bits) ->
    float32-typed words (rows, count) holding those bits."""
    bits = 32 // q.shape[-1]
    shifts = torch.arange(q.shape[-1], dtype=torch.int64) * bits
    words = ((q.long() & ((1 << bits) - 1)) << shifts).sum(-1)  # (rows, count), 0 <= w < 2**32
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).view(torch.float32)


def dequantized_linear(x: torch.Tensor, spec: QuantSpec, dequantize, tensors) -> torch.Tensor:
    """x (..., cols) @ dequantize(weight).T in fp32, a block of rows at a time, so no full float copy
    of the weight ever exists; the result in x's dtype (..., rows)."""
    rows, cols = tensors[0].shape[0], x.shape[-1]
    x32 = x.float()  # (..., cols)
    out = torch.empty(*x.shape[:-1], rows, dtype=torch.float32, device=x.device)  # (..., rows)
    step = max(1, _CHUNK_ELEMENTS // cols)
    for start in range(0, rows, step):
        block = dequantize(spec, *(t[start : start + step] for t in tensors))  # (step, cols)
        out[..., start : start + step] = x32 @ block.t()
    return out.to(x.dtype)
