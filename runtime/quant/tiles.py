"""The integer family's row tiles: weight rows stored four at a time, interleaved block by block.

Owns the tile arithmetic both integer schemes share (exporter/csrc/quant_common.h, TILE): a tile's four
rows are written block by block (each scheme says how a block holds its rows: int8 puts the four rows'
bytes one after another, int4 pairs rows in the two nibbles of each byte), so the kernel reads a tile as
one sequential run; the rows past the last whole tile are stored as they are. A row of a few hundred
bytes alone is too short for the CPU's prefetcher to follow: tiled, the int8 GEMV read 1.7x faster from
memory here. Reading rows back (the embedding lookup, dequantization) is a gather through a position table,
with no branch on the ids, so it traces into the decode graph.
"""

from __future__ import annotations

import torch

TILE = 4


def split(n: int) -> int:
    """Rows in whole tiles, of n."""
    return n // TILE * TILE


def gather(stored: torch.Tensor, ids: torch.Tensor, tiled: torch.Tensor, lone: torch.Tensor) -> torch.Tensor:
    """Elements of rows `ids` (k,) of a tiled (N, width) tensor: `tiled` (TILE, out) gives, for each lane of
    a tile, the position in the tile's TILE * width elements of each output column; `lone` (out,) the
    position in a lone row's width. -> (k, out)."""
    n, width = stored.shape
    whole, ids = split(n), ids.reshape(-1)
    picked = None
    if whole:
        tile = ids.div(TILE, rounding_mode="floor").clamp(max=whole // TILE - 1)
        picked = stored[:whole].reshape(whole // TILE, TILE * width)[tile].gather(1, tiled[ids % TILE])
    if whole < n:
        single = stored[ids.clamp(min=whole)].gather(1, lone.expand(len(ids), -1))
        picked = single if picked is None else torch.where((ids < whole)[:, None], picked, single)
    return picked


def interleave(rows: torch.Tensor, block: int) -> torch.Tensor:
    """(n, width) elements in row order -> the same shape, tiled with each block's TILE rows one after another
    (a row's last width % block elements form a short block at the tile's end): int8's layout."""
    n, width = rows.shape
    count, full = split(n) // TILE, width // block * block
    head = rows[: count * TILE].view(count, TILE, width)
    blocks = head[..., :full].reshape(count, TILE, full // block, block).transpose(1, 2)  # (tiles, blocks, TILE, block)
    tails = head[..., full:]  # (tiles, TILE, width % block)
    tiled = torch.cat([blocks.reshape(count, TILE * full), tails.reshape(count, TILE * (width - full))], 1)
    return torch.cat([tiled.reshape(count * TILE, width), rows[count * TILE :]]).contiguous()


def interleaved_positions(width: int, block: int) -> torch.Tensor:
    """(TILE, width): where column c of lane l sits in a tile laid out by `interleave`."""
    full, tail = width // block * block, width % block
    c, lane = torch.arange(width), torch.arange(TILE)[:, None]
    inside = (c // block) * block * TILE + lane * block + c % block
    return torch.where(c < full, inside, TILE * full + lane * tail + (c - full))


def tile_rows(values: torch.Tensor) -> torch.Tensor:
    """(n, width) per-row values (int4's scales, mins) -> tiled column by column: a tile's four rows'
    values of each column together."""
    return interleave(values, 1)


def tiled_rows(stored: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` (k,) of values tiled by `tile_rows`: (k, width)."""
    width = stored.shape[1]
    return gather(stored, ids, interleaved_positions(width, 1), torch.arange(width))
