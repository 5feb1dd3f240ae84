"""int5 with integer dot products (the integer family only): llama.cpp's Q5_0, the 5-bit weights an int4
bundle's recipe holds where Q4_K_M gives Q5_0 (exporter.quantize). A weight is `(q - 16) * scale`, q in
0..31, one fp16 scale per group of 32 (64 or 128) columns, multiplied with activations quantized per
block of 32 (exporter/csrc/int5.cpp).

Owns the scheme's grid (Q5_0's: the group's value of largest magnitude maps to -16, so a weight already on
a Q5_0 grid, as much of the PyPI Gemma 3 270M is, comes back exactly), its layout, its eager op
(`aotpack::dot_linear_int5`, run through the bundle's kernels.so, runtime.quant.native) and the C shim
that the compiled decode calls for the same op.

Layout: q's low four bits are int4's `codes` (runtime.quant.int4_dot); its fifth bits are `highs` (rows,
cols / 8) uint8. In a tile, a block's 64 bytes of fifth bits follow its four code loads: for each, 8 bytes
for the low nibbles' vector and 8 for the high nibbles', bit i the fifth bit of that vector's byte i
(lane i / 4), so an AVX-512 mask register takes them in one load. A lone row's bits go in column order.
`scales` (rows, groups) fp16, tiled as int4's.
"""

from __future__ import annotations

import torch

from runtime.format.quant import INT5, INTEGER
from runtime.quant import int4_dot, native, tiles
from runtime.quant.scheme import Scheme, cat_like, product_like

SCALE_DTYPE = torch.float16  # Q5_0's: a weight on its grid keeps its exact step
OFFSET = 16  # q - 16 in -16..15
_LARGEST = torch.finfo(SCALE_DTYPE).max


def grid(spec, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A float (rows, cols) weight -> (integers (rows, cols) in 0..31, scales (rows, groups) fp16): each
    group's value of largest magnitude, sign included, maps to q = 0 (llama.cpp's quantize_row_q5_0)."""
    w = weight.detach().float().cpu()
    rows, cols = w.shape
    grouped = w.view(rows, cols // spec.group_size, spec.group_size)  # (rows, groups, gs)
    extreme = grouped.gather(-1, grouped.abs().argmax(-1, keepdim=True)).squeeze(-1)  # (rows, groups)
    scales = (extreme / -OFFSET).clamp(-_LARGEST, _LARGEST).to(SCALE_DTYPE)
    return integers(spec, w, scales), scales


def integers(spec, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The nearest of the 32 levels `(q - 16) * scale` of each group (against the stored fp16 scale)."""
    rows, cols = weight.shape
    grouped = weight.float().view(rows, cols // spec.group_size, spec.group_size)
    step = scales.float()[..., None]  # (rows, groups, 1)
    safe = torch.where(step != 0, step, torch.ones_like(step))
    q = torch.where(step != 0, torch.round(grouped / safe), torch.zeros_like(grouped)) + OFFSET
    return q.clamp(0, 2 * OFFSET - 1).view(rows, cols)


def arrange(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """integers (rows, cols) in 0..31 -> (codes (rows, cols / 2), highs (rows, cols / 8))."""
    q = q.to(torch.uint8)
    return int4_dot.arrange(q & 15), _fifth_bits(q >> 4)


def _fifth_bits(h: torch.Tensor) -> torch.Tensor:
    """bits (rows, cols) -> highs (rows, cols / 8). Column c's bit is bit c % 4 of slot c // 4 (a slot: the 4
    columns one lane of a code vector holds); a tile holds each slot's 16 lanes' nibbles together, two to a
    byte, and a lone row its slots in order, which is its bits in column order."""
    n, cols = h.shape
    whole = tiles.split(n)
    slots = (h.view(n, cols // 4, 4) << torch.arange(4, dtype=torch.uint8)).sum(-1, dtype=torch.uint8)  # (n, cols/4)
    tiled = tiles.interleave(slots[:whole], 1).view(-1, 2)  # per tile, slot by slot, its 16 lanes' nibbles
    lone = slots[whole:].reshape(-1, 2)
    paired = torch.cat([tiled, lone])  # (n * cols / 8, 2): each byte's two nibbles
    return (paired[:, 0] | (paired[:, 1] << 4)).view(n, cols // 8)


def rows(codes: torch.Tensor, highs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The integers of weight rows `ids` (n,) as uint8 (n, cols), in column order."""
    width = highs.shape[1]
    c, lane = torch.arange(8 * width), torch.arange(tiles.TILE)[:, None]
    at = tiles.gather(highs, ids, (c // 4) * 8 + lane // 2, c // 8)  # (n, cols): the byte holding each bit
    in_tile = (ids.reshape(-1) < tiles.split(highs.shape[0]))[:, None]
    shift = torch.where(in_tile, (4 * (lane % 2) + c % 4)[ids.reshape(-1) % tiles.TILE], c % 8)  # (n, cols)
    return int4_dot.rows(codes, ids) | (((at >> shift.to(torch.uint8)) & 1) << 4)


def dequantize(spec, codes, highs, scales, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Rows `ids` (default: all) as fp32 (n, cols)."""
    ids = torch.arange(codes.shape[0]) if ids is None else ids
    q = rows(codes, highs, ids).float() - OFFSET  # (n, cols)
    grouped = q.view(q.shape[0], -1, spec.group_size)  # (n, groups, group_size)
    return (grouped * tiles.tiled_rows(scales, ids).float()[..., None]).view(q.shape)


@torch.library.custom_op("aotpack::dot_linear_int5", mutates_args=())
def dot_linear_int5(
    x: torch.Tensor, codes: torch.Tensor, highs: torch.Tensor, scales: torch.Tensor, group_size: int
) -> torch.Tensor:
    return native.linear_int5(x, codes, highs, scales, group_size)


dot_linear_int5.register_fake(product_like)


@torch.library.custom_op("aotpack::dot_linear_int5_cat", mutates_args=())
def dot_linear_int5_cat(
    x: torch.Tensor, codes: list[torch.Tensor], highs: list[torch.Tensor], scales: list[torch.Tensor], group_size: int
) -> torch.Tensor:
    """x times each weight (codes[p], highs[p], scales[p]), the outputs side by side: one kernel call."""
    return native.linear_cat(INT5, x, (codes, highs, scales), group_size)


dot_linear_int5_cat.register_fake(cat_like)


SCHEME = Scheme(
    method=INT5,
    kernels=INTEGER,
    tensors=("codes", "highs", "scales"),
    dtypes=(torch.uint8, torch.uint8, SCALE_DTYPE),
    fields=2,
    grid=grid,
    arrange=arrange,
    arrange_scales=tiles.tile_rows,
    dequantize=dequantize,
    op=torch.ops.aotpack.dot_linear_int5.default,
    candidates={},
    tiled=True,
    grouped=True,
    planes=(8,),
    c_shim="AOTITorchError aoti_torch_cpu_dot_linear_int5(AtenTensorHandle x, AtenTensorHandle codes, "
    "AtenTensorHandle highs, AtenTensorHandle scales, int64_t group_size, AtenTensorHandle* ret0)",
    cat_op=torch.ops.aotpack.dot_linear_int5_cat.default,
    cat_shim="AOTITorchError aoti_torch_cpu_dot_linear_int5_cat(AtenTensorHandle x, const AtenTensorHandle* codes, "
    "int64_t codes_len_, const AtenTensorHandle* highs, int64_t highs_len_, const AtenTensorHandle* scales, "
    "int64_t scales_len_, int64_t group_size, AtenTensorHandle* ret0)",
)
