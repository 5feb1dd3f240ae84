"""The attention masks aotpack builds itself: for the decode step, and for a prefill chunk that
continues a cache.

Owns: which cache slots each query may attend to, derived from absolute cache indices, so they are
right for full layers and for ring buffers before and after the window fills (runtime.format.layout:
token `t` lives in slot `t % slots`), and the form a model's `attention_mask` argument takes them in
(booleans for SDPA, additive floats for eager attention). The decode masks run inside the traced step.
"""

from __future__ import annotations

import torch

from runtime import compat
from runtime.format.layout import FULL
from runtime.model.cache import attended_slots, in_order


def decode_masks(
    pad_mask: torch.Tensor, cache_position: torch.Tensor, layout, tokens: int = 1
) -> dict[str, torch.Tensor]:
    """Boolean SDPA masks (B, 1, T, n) for one step of T = `tokens` queries per row over cache indices
    [0, span), keyed by layer kind; n is the layer's attended slots (runtime.model.cache.attended_slots).

    pad_mask: (B, span) bool, True where the absolute cache index holds a real token (the step's own too).
    cache_position: (B,) int64, the absolute index of each row's first query (rows are independent); query
    t of a row sits at cache_position + t, every one < span (a verify step's drafts follow the token).
    Slot j of a ring with n slots holds index i = q - ((q - j) mod n) for query q: the newest index <= q in
    that slot (the step wrote its own tokens first; a later query's slot reads as i - n, outside the
    window). It is live when i >= 0, within the window and not padding: exactly HF's
    `q - window < kv_idx <= q`.
    """
    span = pad_mask.shape[1]
    query = cache_position[:, None, None] + torch.arange(tokens, device=pad_mask.device)[None, :, None]  # (B, T, 1)
    masks = {}
    for layer in layout:
        if layer.kind in masks:
            continue
        slots = torch.arange(attended_slots(layer, span), device=pad_mask.device)[None, None]  # (1, 1, n)
        if layer.kind == FULL:
            padded = pad_mask[:, None, :]  # (B, 1, span): slot j holds index j
            live = slots <= query  # (B, T, span)
        else:
            index = query - torch.remainder(query - slots, layer.slots)  # (B, T, n)
            padded = pad_mask[:, None, :].expand(-1, tokens, -1).gather(2, index.clamp(min=0))  # (B, T, n)
            live = (index >= 0) & (index > query - layer.window)
        masks[layer.kind] = (padded & live)[:, None]
    return masks


def chunk_masks(real: torch.Tensor, start: int, layout) -> dict[str, torch.Tensor]:
    """Boolean SDPA masks (b, 1, c, keys) for a prefill chunk of indices [start, end) continuing a cache
    that holds [0, start), keyed by layer kind, in SlotLayer._continue's key order (a ring's slots in
    index order while the chunk does not wrap it, else its slots as they were, then the chunk).

    real: (b, end) bool, True where an index holds a real token (False: padding).
    A query sees real keys at or before it (within the window on a ring), and always itself, so that a
    padding query, whose output nothing reads, still has one key and stays finite.
    """
    end = real.shape[1]
    query = torch.arange(start, end, device=real.device)[:, None]  # (c, 1) absolute indices
    chunk = torch.arange(start, end, device=real.device)[None]  # (1, c)
    masks = {}
    for layer in layout:
        if layer.kind in masks:
            continue
        if layer.kind == FULL or in_order(end, layer.slots):
            keys = torch.arange(end, device=real.device)[None]  # (1, end): slot j holds index j
            seen = (keys <= query) if layer.kind == FULL else (keys <= query) & (query - keys < layer.window)
            visible = seen[None] & real[:, None, :]  # (b, c, end)
            visible |= (keys == query)[None]
        else:
            n, window = layer.slots, layer.window
            held = (start - 1) - torch.remainder(start - 1 - torch.arange(n, device=real.device), n)  # (n,)
            ring = ((held >= 0) & (query - held < window))[None] & real[:, held.clamp(min=0)][:, None, :]  # (b, c, n)
            own = ((chunk <= query) & (query - chunk < window))[None] & real[:, None, start:]  # (b, c, c)
            visible = torch.cat([ring, own | (chunk == query)[None]], dim=-1)
        masks[layer.kind] = visible[:, None]
    return masks


def additive_mask_dtype(model) -> torch.dtype | None:
    """Eager attention adds its mask to the scores: such models take float masks in their dtype."""
    return model.dtype if compat.attention_implementation(model.config.get_text_config()) == "eager" else None


def mask_argument(masks: dict[str, torch.Tensor], additive_dtype: torch.dtype | None = None):
    """What a model's `attention_mask` takes: mixed-kind models read a dict per layer kind; single-kind
    models take a prepared 4D mask, which transformers' mask builders return as-is. Eager attention
    adds its mask to the scores, so it gets 0 / dtype-min floats (as transformers' eager masks) rather
    than booleans: `additive_dtype` is the model's dtype then."""
    if additive_dtype is not None:
        low = torch.finfo(additive_dtype).min
        masks = {kind: torch.zeros((), dtype=additive_dtype).masked_fill(~m, low) for kind, m in masks.items()}
    return next(iter(masks.values())) if len(masks) == 1 else masks
