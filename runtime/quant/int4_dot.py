"""int4 with integer dot products (the integer family): the weights as runtime.quant.int4 chooses them
(asymmetric, a bf16 scale and min per group of 32, 64 or 128 columns), multiplied with activations
quantized per block of 32.

Owns the scheme's layout, its eager op (`aotpack::dot_linear_int4`, run through the bundle's kernels.so,
runtime.quant.native) and the C shim that the compiled decode calls for the same op.

Layout: rows in tiles of four (runtime.quant.tiles). `codes` (rows, cols / 2) uint8, a tile's rows
written block by block: a tile's block of 32 columns is 64 bytes, rows 0 and 1 in the low and high nibbles
of the first 32 (byte i holds column i of both), rows 2 and 3 in the next 32, so one load and a mask or a
shift give a row's 32 values in column order. `scales` and `mins` (rows, groups) bf16, a tile's group by
group, its four rows' values together (one load each per group in the kernel). A row past the last whole
tile is stored as it is: 16 bytes a block, column i in the low nibble of byte i and column i + 16 in the
high one (llama.cpp's Q4 order).
"""

from __future__ import annotations

import torch

from runtime.format.quant import INT4, INTEGER
from runtime.quant import int4, native, tiles
from runtime.quant.scheme import Scheme
from runtime.quant.tiles import TILE


def arrange(q: torch.Tensor) -> torch.Tensor:
    """integers (rows, cols) in 0..15 -> codes (rows, cols / 2)."""
    n, cols = q.shape
    count, q = n // TILE, q.to(torch.uint8)
    tiled = q[: count * TILE].view(count, TILE // 2, 2, cols // 32, 32)  # (tiles, pair, nibble, blocks, 32)
    pairs = (tiled[:, :, 0] | (tiled[:, :, 1] << 4)).transpose(1, 2)  # (tiles, blocks, pair, 32)
    lone = q[count * TILE :].view(-1, cols // 32, 2, 16)  # (rows, blocks, half, 16)
    lone = lone[:, :, 0] | (lone[:, :, 1] << 4)
    return torch.cat([pairs.reshape(count * TILE, cols // 2), lone.reshape(-1, cols // 2)]).contiguous()


def rows(codes: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The integers of weight rows `ids` (n,) as uint8 (n, cols), in column order."""
    cols = 2 * codes.shape[1]
    c, lane = torch.arange(cols), torch.arange(TILE)[:, None]
    block, i = c // 32, c % 32
    tiled = block * 64 + (lane // 2) * 32 + i  # (TILE, cols): the byte holding column c of lane l
    lone = block * 16 + i % 16  # a lone row's: columns i and i + 16 share a byte
    picked = tiles.gather(codes, ids, tiled, lone)  # (n, cols) bytes
    ids = ids.reshape(-1)
    shift_tiled = (4 * (ids % TILE % 2))[:, None]  # odd lanes in the high nibble
    shift_lone = (4 * (i // 16))[None]  # columns 16..31 of a block in the high nibble
    shift = torch.where((ids < tiles.split(codes.shape[0]))[:, None], shift_tiled, shift_lone)
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


@dot_linear_int4.register_fake
def _(x, codes, scales, mins, group_size):
    return x.new_empty(*x.shape[:-1], codes.shape[0])


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
)
