"""int4 with integer dot products (the integer family): the weights as runtime.quant.int4 chooses them
(asymmetric, a bf16 scale and min per group of 32, 64 or 128 columns), multiplied with activations
quantized per block of 32.

Owns the scheme's layout, its eager op (`aotpack::dot_linear_int4`, run through the bundle's kernels.so,
runtime.quant.native) and the C shim that the compiled decode calls for the same op.

Layout: `codes` (rows, cols / 2) uint8. A row's block of 32 columns is 16 bytes, byte 4p + j holding
column 8p + j in its low nibble and column 8p + 4 + j in its high one, so that rows in tiles of 16
(runtime.quant.tiles), each block's bytes 4 at a time with the 16 rows' 4 bytes one after another, give
two groups of 4 columns of all 16 rows for one 64-byte load and a mask or a shift. `scales` and `mins`
(rows, groups) bf16, a tile's group by group, its 16 rows' values together (one load each per group in
the kernel). Rows past the last whole tile are stored as they are.
"""

from __future__ import annotations

import torch

from runtime.format.quant import INT4, INTEGER
from runtime.quant import int4, native, tiles
from runtime.quant.scheme import Scheme, cat_like, product_like


def _byte_of(cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each column (cols,): the byte of a row's bytes holding it, and its nibble's shift."""
    c = torch.arange(cols)
    return (c // 32) * 16 + (c % 32) // 8 * 4 + c % 4, (c % 8) // 4 * 4


def arrange(q: torch.Tensor) -> torch.Tensor:
    """integers (rows, cols) in 0..15 -> codes (rows, cols / 2)."""
    n, cols = q.shape
    q = q.to(torch.uint8).view(n, cols // 8, 2, 4)  # (rows, groups of 8 columns, nibble, 4)
    pairs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, cols // 2)  # byte 4p + j of each block, in order
    return tiles.interleave(pairs, 16, tiles.GROUP)


def rows(codes: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The integers of weight rows `ids` (n,) as uint8 (n, cols), in column order."""
    width = codes.shape[1]
    byte, shift = _byte_of(2 * width)
    tiled = tiles.interleaved_positions(width, 16, tiles.GROUP)[:, byte]  # (TILE, cols)
    picked = tiles.gather(codes, ids, tiled, byte)  # (n, cols) bytes
    return (picked >> shift.to(torch.uint8)) & 15


def dequantize(spec, codes, scales, mins, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Rows `ids` (default: all) as fp32 (n, cols)."""
    ids = torch.arange(codes.shape[0]) if ids is None else ids
    return int4.values(spec, rows(codes, ids), tiles.tiled_rows(scales, ids), tiles.tiled_rows(mins, ids))


@torch.library.custom_op("aotpack::dot_linear_int4", mutates_args=())
def dot_linear_int4(
    x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, group_size: int
) -> torch.Tensor:
    return native.linear_int4(x, codes, scales, mins, group_size)


dot_linear_int4.register_fake(product_like)


@torch.library.custom_op("aotpack::dot_linear_int4_cat", mutates_args=())
def dot_linear_int4_cat(
    x: torch.Tensor, codes: list[torch.Tensor], scales: list[torch.Tensor], mins: list[torch.Tensor], group_size: int
) -> torch.Tensor:
    """x times each weight (codes[p], scales[p], mins[p]), the outputs side by side: one kernel call."""
    return native.linear_cat(INT4, x, (codes, scales, mins), group_size)


dot_linear_int4_cat.register_fake(cat_like)


SCHEME = Scheme(
    method=INT4,
    kernels=INTEGER,
    tensors=("codes", "scales", "mins"),
    dtypes=(torch.uint8, int4.SCALE_DTYPE, int4.SCALE_DTYPE),
    fields=2,
    grid=int4.grid,
    arrange=arrange,
    arrange_scales=tiles.tile_rows,
    dequantize=dequantize,
    op=torch.ops.aotpack.dot_linear_int4.default,
    candidates={},
    tiled=True,
    grouped=True,
    c_shim="AOTITorchError aoti_torch_cpu_dot_linear_int4(AtenTensorHandle x, AtenTensorHandle codes, "
    "AtenTensorHandle scales, AtenTensorHandle mins, int64_t group_size, AtenTensorHandle* ret0)",
    cat_op=torch.ops.aotpack.dot_linear_int4_cat.default,
    cat_shim="AOTITorchError aoti_torch_cpu_dot_linear_int4_cat(AtenTensorHandle x, const AtenTensorHandle* codes, "
    "int64_t codes_len_, const AtenTensorHandle* scales, int64_t scales_len_, const AtenTensorHandle* mins, "
    "int64_t mins_len_, int64_t group_size, AtenTensorHandle* ret0)",
)
