"""Weight-only int8 and int4 quantization: the packed format a bundle stores, and the eager math over it.

Owns: what a quantized weight is (32-bit words of packed integers plus scales, one set of tensors per
weight, shared by a tied embedding and `lm_head`), the modules that stand in for `nn.Linear` and
`nn.Embedding` in the eager model, and the `aotpack::woq_linear_*` ops that the eager prefill runs.
The exporter replaces those ops in the decode graph with fused Inductor reductions over the very same
tensors (exporter/lowering.py), so eager prefill and compiled decode read one copy of every weight.

The meaning of a quantized weight, whichever kernel reads it: dequantize to fp32 (int8: `q * scale`,
one scale per row; int4: `q * scale + min`, one pair per group of columns), multiply with the
activations in fp32, accumulate in fp32, cast the result to the activation dtype.

Layouts, chosen for the decode kernels (each word is read with a full-width vector load, then split
with shifts; see exporter/lowering.py):
- int8: `words` (rows, cols/4); byte j of word c holds column `j * cols/4 + c` (planar by quarters),
  signed, symmetric.
- int4: `words` (rows, cols/8); nibble j of word c holds column `8c + j` (sequential), unsigned.
The words are stored as float32-typed tensors holding raw integer bits: torch 2.13's AVX2
`Vectorized<int32_t>::loadu(ptr, count)` always goes through a memcpy, which Inductor's integer loads
hit; a float load of the same bits is one instruction, and a bitcast makes it an int32 vector again.
Nothing ever does float arithmetic on `words`: it is only viewed as int32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

INT8 = "int8"
INT4 = "int4"
METHODS = (INT8, INT4)
GROUP_SIZES = (32, 64, 128)
WORD_FIELDS = {INT8: 4, INT4: 8}  # packed integers per 32-bit word
SCALE_DTYPE = {INT8: torch.float32, INT4: torch.bfloat16}  # int4 keeps scale and min per group: bf16 halves them
_CHUNK_ELEMENTS = 1 << 20  # eager dequantization works through rows in blocks of about this many weights


@dataclass(frozen=True)
class QuantSpec:
    """How a bundle's linear layers and token embedding are quantized."""

    method: str  # INT8 or INT4
    group_size: int | None  # INT4: columns per (scale, min) pair; INT8: None, one scale per row

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"quantization method {self.method!r} is not one of {METHODS}")
        if (self.method == INT4) != (self.group_size is not None):
            raise ValueError("a group size goes with int4 only")
        if self.group_size is not None and self.group_size not in GROUP_SIZES:
            raise ValueError(f"int4 group size {self.group_size} is not one of {GROUP_SIZES}")

    def accepts(self, cols: int) -> bool:
        """Whether a weight with `cols` input columns can be packed with this spec."""
        return cols % (self.group_size or WORD_FIELDS[self.method]) == 0 and cols % WORD_FIELDS[self.method] == 0


class PackedWeight(nn.Module):
    """One quantized (rows, cols) weight. Buffers: `words` (rows, cols / fields) float32-typed bits,
    `scales` (rows,) for int8 or (rows, groups) for int4, and `mins` (rows, groups) for int4."""

    def __init__(self, spec: QuantSpec, rows: int, cols: int, device=None):
        super().__init__()
        if not spec.accepts(cols):
            raise ValueError(f"a weight with {cols} columns cannot be packed as {spec}")
        self.spec, self.rows, self.cols = spec, rows, cols
        self.register_buffer("words", torch.empty(rows, cols // WORD_FIELDS[spec.method], device=device))
        groups = (rows,) if spec.method == INT8 else (rows, cols // spec.group_size)
        self.register_buffer("scales", torch.empty(groups, dtype=SCALE_DTYPE[spec.method], device=device))
        if spec.method == INT4:
            self.register_buffer("mins", torch.empty(groups, dtype=SCALE_DTYPE[spec.method], device=device))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.words, self.scales) + ((self.mins,) if self.spec.method == INT4 else ())

    def dequantize(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows start..stop as fp32 (stop - start, cols)."""
        return dequantize(self.spec, *(t[start:stop] for t in self.tensors()))

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (any shape) as fp32 (*ids.shape, cols): the embedding lookup."""
        flat = ids.reshape(-1)
        rows = dequantize(self.spec, *(t.index_select(0, flat) for t in self.tensors()))
        return rows.view(*ids.shape, self.cols)


def unpack(method: str, words: torch.Tensor) -> torch.Tensor:
    """Packed words (R, W) -> the integers (R, W * fields) in column order, as int32."""
    w = words.view(torch.int32)  # (R, W)
    rows, count = w.shape
    fields = torch.arange(WORD_FIELDS[method], dtype=torch.int32, device=w.device)
    if method == INT8:  # byte j of word c is column j * W + c; shift it to the top, then sign-extend down
        q = (w[:, None, :] << (24 - 8 * fields)[:, None]) >> 24  # (R, 4, W)
    else:  # nibble j of word c is column 8c + j
        q = (w[:, :, None] >> (4 * fields)) & 15  # (R, W, 8)
    return q.reshape(rows, -1)


def dequantize(spec: QuantSpec, words, scales, mins=None) -> torch.Tensor:
    q = unpack(spec.method, words).float()  # (R, cols)
    if spec.method == INT8:
        return q * scales.float()[:, None]
    grouped = q.view(q.shape[0], -1, spec.group_size)  # (R, groups, group_size)
    return (grouped * scales.float()[..., None] + mins.float()[..., None]).view(q.shape)


def _dequantized_linear(x: torch.Tensor, spec: QuantSpec, tensors) -> torch.Tensor:
    """x (..., cols) @ dequantize(weight).T in fp32, a block of rows at a time, so no full float copy
    of the weight ever exists; the result in x's dtype (..., rows)."""
    words = tensors[0]
    rows, cols = words.shape[0], words.shape[1] * WORD_FIELDS[spec.method]
    x32 = x.float()  # (..., cols)
    out = torch.empty(*x.shape[:-1], rows, dtype=torch.float32, device=x.device)  # (..., rows)
    step = max(1, _CHUNK_ELEMENTS // cols)
    for start in range(0, rows, step):
        block = dequantize(spec, *(t[start : start + step] for t in tensors))  # (step, cols)
        out[..., start : start + step] = x32 @ block.t()
    return out.to(x.dtype)


@torch.library.custom_op("aotpack::woq_linear_int8", mutates_args=())
def woq_linear_int8(x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return _dequantized_linear(x, QuantSpec(INT8, None), (words, scales))


@torch.library.custom_op("aotpack::woq_linear_int4", mutates_args=())
def woq_linear_int4(
    x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, group_size: int
) -> torch.Tensor:
    return _dequantized_linear(x, QuantSpec(INT4, group_size), (words, scales, mins))


@woq_linear_int8.register_fake
def _(x, words, scales):
    return x.new_empty(*x.shape[:-1], words.shape[0])


@woq_linear_int4.register_fake
def _(x, words, scales, mins, group_size):
    return x.new_empty(*x.shape[:-1], words.shape[0])


class QuantizedLinear(nn.Module):
    """Stands in for `nn.Linear` with a packed weight; one op in a traced graph."""

    def __init__(self, packed: PackedWeight, bias: torch.Tensor | None = None):
        super().__init__()
        self.packed = packed
        self.in_features, self.out_features = packed.cols, packed.rows
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.packed
        if p.spec.method == INT8:
            y = torch.ops.aotpack.woq_linear_int8(x, p.words, p.scales)
        else:
            y = torch.ops.aotpack.woq_linear_int4(x, p.words, p.scales, p.mins, p.spec.group_size)
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
