"""int8 with integer dot products (the integer family): the weights as runtime.quant.int8 chooses them
(symmetric, one fp32 scale per row), multiplied with activations quantized per block of 32.

Owns the scheme's layout, its eager op (`aotpack::dot_linear_int8`, which the prefill runs through the
bundle's kernels.so, runtime.quant.native) and the C shim that the compiled decode calls for the same op:
prefill and decode run one kernel, so they agree bit for bit.

Layout: `codes` (rows, cols) uint8, each weight plus 128 (VNNI's dpbusd multiplies unsigned weight bytes
by signed activation bytes), rows in tiles of 16 (runtime.quant.tiles): within a tile each block of 32
columns holds groups of 4 columns, a group the 16 rows' 4 bytes one after another (one vector, one row a
lane), so the kernel streams a tile in one run.
"""

from __future__ import annotations

import torch

from runtime.format.quant import INT8, INTEGER
from runtime.quant import int8, native, tiles
from runtime.quant.scheme import Scheme, cat_like, product_like

OFFSET = 128  # stored = weight + OFFSET


def arrange(q: torch.Tensor) -> torch.Tensor:
    """integers (rows, cols) in -127..127 -> codes (rows, cols), offset and tiled. -128 is refused: the AVX2
    path moves x's signs onto the weights, and -128 has no positive twin."""
    if q.numel() and (q.min() < -127 or q.max() > 127):
        raise ValueError(f"int8 codes must lie in -127..127, got {q.min().item()}..{q.max().item()}")
    return tiles.interleave((q.to(torch.int16) + OFFSET).to(torch.uint8), 32, tiles.GROUP)


def rows(codes: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The integers of weight rows `ids` (n,) as int8 (n, cols), in column order."""
    cols = codes.shape[1]
    stored = tiles.gather(codes, ids, tiles.interleaved_positions(cols, 32, tiles.GROUP), torch.arange(cols))
    return (stored.to(torch.int16) - OFFSET).to(torch.int8)


def dequantize(spec, codes: torch.Tensor, scales: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Rows `ids` (default: all) as fp32 (n, cols)."""
    ids = torch.arange(codes.shape[0]) if ids is None else ids
    return rows(codes, ids).float() * scales.float()[ids][:, None]


@torch.library.custom_op("aotpack::dot_linear_int8", mutates_args=())
def dot_linear_int8(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return native.linear_int8(x, codes, scales)


dot_linear_int8.register_fake(product_like)


@torch.library.custom_op("aotpack::dot_linear_int8_cat", mutates_args=())
def dot_linear_int8_cat(x: torch.Tensor, codes: list[torch.Tensor], scales: list[torch.Tensor]) -> torch.Tensor:
    """x times each weight (codes[p], scales[p]), the outputs side by side: one kernel call."""
    return native.linear_cat(INT8, x, (codes, scales))


dot_linear_int8_cat.register_fake(cat_like)


SCHEME = Scheme(
    method=INT8,
    kernels=INTEGER,
    tensors=("codes", "scales"),
    dtypes=(torch.uint8, torch.float32),
    fields=1,
    grid=int8.grid,
    arrange=arrange,
    arrange_scales=None,
    dequantize=dequantize,
    op=torch.ops.aotpack.dot_linear_int8.default,
    candidates={},
    tiled=True,
    c_shim="AOTITorchError aoti_torch_cpu_dot_linear_int8(AtenTensorHandle x, AtenTensorHandle codes, "
    "AtenTensorHandle scales, AtenTensorHandle* ret0)",
    cat_op=torch.ops.aotpack.dot_linear_int8_cat.default,
    cat_shim="AOTITorchError aoti_torch_cpu_dot_linear_int8_cat(AtenTensorHandle x, const AtenTensorHandle* codes, "
    "int64_t codes_len_, const AtenTensorHandle* scales, int64_t scales_len_, AtenTensorHandle* ret0)",
)
