"""The modules a quantized eager model holds in place of `nn.Linear` and `nn.Embedding`.

Owns one packed weight as one set of buffers (shared by a tied embedding and `lm_head`), the linear
layer that calls its scheme's eager op (one op in a traced graph, which the exporter lowers), and the
embedding lookup that dequantizes only the rows it reads.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.format.quant import QuantSpec
from runtime.quant.registry import scheme


class PackedWeight(nn.Module):
    """One quantized (rows, cols) weight: its scheme's buffers, e.g. `codes` (rows, cols / fields) or the
    inductor family's `words`, `scales` (rows,) or (rows, groups), and for int4 `mins` (rows, groups)."""

    def __init__(self, spec: QuantSpec, rows: int, cols: int, device=None):
        super().__init__()
        if not spec.accepts(cols):
            raise ValueError(f"a weight with {cols} columns cannot be packed as {spec}")
        self.spec, self.scheme, self.rows, self.cols = spec, scheme(spec), rows, cols
        s = self.scheme
        for name, dtype, shape in zip(s.tensors, s.dtypes, s.shapes(spec, rows, cols), strict=True):
            self.register_buffer(name, torch.empty(shape, dtype=dtype, device=device))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(self, name) for name in self.scheme.tensors)

    def dequantize(self) -> torch.Tensor:
        """The whole weight as fp32 (rows, cols)."""
        return self.scheme.dequantize(self.spec, *self.tensors())

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (any shape) as fp32 (*ids.shape, cols): the embedding lookup."""
        return self.scheme.gather(self.spec, self.tensors(), ids.reshape(-1)).view(*ids.shape, self.cols)

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., cols) -> (..., rows) through the scheme's eager op."""
        return self.scheme.op(x, *self.tensors(), *self.scheme.op_extras(self.spec))

    @classmethod
    def of(cls, spec: QuantSpec, weight: torch.Tensor, grid: tuple[torch.Tensor, ...] | None = None) -> PackedWeight:
        """A float (rows, cols) weight, packed; `grid`: its integers and scales, if chosen elsewhere."""
        module = cls(spec, *weight.shape)
        for buffer, value in zip(module.tensors(), module.scheme.pack(spec, weight, grid), strict=True):
            buffer.copy_(value)
        return module.to(weight.device)


class QuantizedLinear(nn.Module):
    """Stands in for `nn.Linear` with a packed weight; one op in a traced graph."""

    def __init__(self, packed: PackedWeight, bias: torch.Tensor | None = None):
        super().__init__()
        self.packed = packed
        self.in_features, self.out_features = packed.cols, packed.rows
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.packed.linear(x)
        return y + self.bias if self.bias is not None else y


class QuantizedEmbedding(nn.Module):
    """Stands in for `nn.Embedding` (or a scaled subclass such as Gemma's) with a packed table; a
    lookup dequantizes only the rows it reads. `embed_scale` keeps the scaled embedding's factor."""

    def __init__(self, packed: PackedWeight, dtype: torch.dtype, embed_scale: torch.Tensor | None = None):
        super().__init__()
        self.packed = packed
        self.dtype = dtype
        self.num_embeddings, self.embedding_dim = packed.rows, packed.cols
        self.register_buffer("embed_scale", embed_scale, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.packed.gather(ids).to(self.dtype)  # (*ids.shape, dim)
        # As the scaled embedding does it: the factor is cast to the weight dtype first.
        return rows * self.embed_scale.to(self.dtype) if self.embed_scale is not None else rows
