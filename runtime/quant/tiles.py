"""The integer family's row tiles: weight rows stored 16 at a time, one to each lane of a vector.

Owns the tile arithmetic the integer schemes share (exporter/csrc/quant_common.h, TILE, GROUP): a tile's
16 rows are written block by block, and within a block a few columns at a time (a group), the 16 rows'
elements of a group one after another, so one vector load gives every row's group and the kernel reads a
tile as one sequential run (a row of a few hundred bytes alone is too short for the CPU's prefetcher to
follow: tiled, the int8 GEMV read 1.7x faster from memory). A tile's last width % block elements follow
row by row; the rows past the last whole tile are stored as they are. Reading rows back (the embedding
lookup, dequantization) is a gather through a position table, with no branch on the ids, so it traces
into the decode graph.
"""

from __future__ import annotations

import torch

TILE = 16  # exporter/csrc/quant_common.h: rows a tile holds, one to a vector lane
GROUP = 4  # ...and the bytes of a row a lane holds together (what one dpbusd lane sums)


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


def interleave(rows: torch.Tensor, block: int, group: int | None = None) -> torch.Tensor:
    """(n, width) elements in row order -> the same shape, tiled: each block of a tile holds its TILE rows'
    elements `group` at a time (default: the whole block), the rows' groups one after another; a row's
    last width % block elements form a short block at the tile's end, row by row."""
    n, width = rows.shape
    group = group or block
    count, full = split(n) // TILE, width // block * block
    head = rows[: count * TILE].view(count, TILE, width)
    grouped = head[..., :full].reshape(count, TILE, full // block, block // group, group)
    blocks = grouped.permute(0, 2, 3, 1, 4)  # (tiles, blocks, groups, TILE, group)
    tails = head[..., full:]  # (tiles, TILE, width % block)
    tiled = torch.cat([blocks.reshape(count, TILE * full), tails.reshape(count, TILE * (width - full))], 1)
    return torch.cat([tiled.reshape(count * TILE, width), rows[count * TILE :]]).contiguous()


def interleaved_positions(width: int, block: int, group: int | None = None) -> torch.Tensor:
    """(TILE, width): where column c of lane l sits in a tile laid out by `interleave`."""
    group = group or block
    full, tail = width // block * block, width % block
    c, lane = torch.arange(width), torch.arange(TILE)[:, None]
    inside = (c // block) * block * TILE + (c % block) // group * group * TILE + lane * group + c % group
    return torch.where(c < full, inside, TILE * full + lane * tail + (c - full))


def tile_rows(values: torch.Tensor) -> torch.Tensor:
    """(n, width) per-row values (int4's scales, mins) -> tiled column by column: a tile's 16 rows'
    values of each column together."""
    return interleave(values, 1)


def tiled_rows(stored: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` (k,) of values tiled by `tile_rows`: (k, width)."""
    width = stored.shape[1]
    return gather(stored, ids, interleaved_positions(width, 1), torch.arange(width))
