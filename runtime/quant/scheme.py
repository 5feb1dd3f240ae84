"""What every quantization scheme provides, and the pieces they share.

Owns `Scheme`: a scheme's packed tensors and their layout, its grid (integers and scales from a float
weight) and dequantization, its eager op (what the prefill runs: `aotpack::woq_linear_<method>` for the
inductor family, `aotpack::dot_linear_<method>` for the integer one), and for the inductor family the
decode lowering candidates the exporter times and compiles in its place (the integer family's op stays
in the graph and AOTInductor calls its C shim). Each scheme is one module (runtime.quant.int8, int4,
int8_dot, int4_dot, int5_dot), registered by method and family in runtime.quant.registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from runtime.format.quant import INDUCTOR, QuantSpec

_CHUNK_ELEMENTS = 1 << 20  # eager dequantization works through rows in blocks of about this many weights


@dataclass(frozen=True)
class Scheme:
    method: str
    kernels: str  # the family (runtime.format.quant): INTEGER or INDUCTOR
    tensors: tuple[str, ...]  # the packed weight's buffers, in the op's argument order
    dtypes: tuple[torch.dtype, ...]  # each buffer's dtype
    fields: int  # integers held by one element of the first buffer (its columns are cols / fields)
    grid: Callable[..., tuple[torch.Tensor, ...]]  # (spec, float (rows, cols)) -> (integers (rows, cols), *scales)
    # integers (rows, cols) -> the first buffer in its layout, or the integer buffers (int5's two: `planes`)
    arrange: Callable[[torch.Tensor], torch.Tensor | tuple[torch.Tensor, ...]]
    arrange_scales: Callable[[torch.Tensor], torch.Tensor] | None  # scales (rows, ...) -> their layout (None: as is)
    dequantize: Callable[..., torch.Tensor]  # (spec, *tensors, ids=None) -> fp32 (rows `ids`, default all; cols)
    op: Callable  # the eager op's overload: (x, *tensors, *op_extras(spec)) -> (..., rows)
    candidates: dict[str, Callable]  # decode lowerings: the op's signature, the same function ({}: the op stays)
    grouped: bool = False  # scales (and mins) per group of columns, the group size an op argument
    c_shim: str | None = None  # the C declaration AOTInductor calls for `op` (the integer family)
    # The integer family's op over several weights at once, outputs side by side: (x, [first buffers],
    # [second buffers], ..., *op_extras) -> (..., rows of all); the decode graphs call it for sibling layers
    # that read the same activations (exporter.siblings), and AOTInductor its C shim `cat_shim`.
    cat_op: Callable | None = None
    cat_shim: str | None = None
    tiled: bool = False  # rows stored in tiles (runtime.quant.tiles): a row is read back through `dequantize`
    planes: tuple[int, ...] = ()  # integers held by an element of each further integer buffer (int5's fifth bits: 8)

    @property
    def name(self) -> str:
        """How lowerings name this scheme's weights: "int8", "int4" (inductor) or "int8-dot", "int4-dot", "int5-dot"."""
        return self.method if self.kernels == INDUCTOR else f"{self.method}-dot"

    def pack(self, spec: QuantSpec, weight: torch.Tensor, grid: tuple[torch.Tensor, ...] | None = None):
        """A float (rows, cols) weight -> the buffers; `grid`: integers and scales chosen elsewhere (the
        exporter's scale search), else this method's own."""
        q, *scales = grid if grid is not None else self.grid(spec, weight)
        arranged = [self.arrange_scales(t) for t in scales] if self.arrange_scales else scales
        integers = self.arrange(q)
        return (*(integers if isinstance(integers, tuple) else (integers,)), *arranged)

    def op_extras(self, spec: QuantSpec) -> tuple:
        return (spec.group_size,) if self.grouped else ()

    def spec_of(self, args: tuple) -> QuantSpec:
        """The spec of an op call's arguments, as a traced graph holds them."""
        return QuantSpec(self.method, args[1 + len(self.tensors)] if self.grouped else None, self.kernels)

    def shapes(self, spec: QuantSpec, rows: int, cols: int) -> tuple[tuple[int, ...], ...]:
        scale = (rows, cols // spec.group_size) if self.grouped else (rows,)
        planes = tuple((rows, cols // fields) for fields in self.planes)
        return ((rows, cols // self.fields), *planes, *(scale for _ in self.tensors[1 + len(planes) :]))

    def gather(self, spec: QuantSpec, tensors: tuple[torch.Tensor, ...], ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (n,) as fp32 (n, cols): the embedding lookup, traceable into the decode graph."""
        if self.tiled:
            return self.dequantize(spec, *tensors, ids=ids)
        return self.dequantize(spec, *(t.index_select(0, ids) for t in tensors))

    def cols(self, first: torch.Tensor) -> int:
        """The weight's input columns, from its first buffer."""
        return first.shape[1] * self.fields


def product_like(x: torch.Tensor, weight: torch.Tensor, *_) -> torch.Tensor:
    """What a linear op of x (..., K) and a weight of N rows (its first buffer) returns, for the tracer:
    every aotpack linear op's fake, whatever its further buffers and arguments."""
    return x.new_empty(*x.shape[:-1], weight.shape[0])  # (..., N)


def cat_like(x: torch.Tensor, weights: list[torch.Tensor], *_) -> torch.Tensor:
    """The same for a cat op (Scheme.cat_op): the weights' outputs side by side."""
    return x.new_empty(*x.shape[:-1], sum(w.shape[0] for w in weights))  # (..., N_1 + N_2 + ...)


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
