"""The KV cache aotpack shares between eager prefill and the compiled decode step.

Owns: the per-layer cache layout (full-length or sliding ring buffer), allocating the tensors once, the
`transformers.Cache` view that prefill and decode write through, and the decode-step attention masks
(`decode_masks`, `mask_argument`: they run only while the exporter traces the decode step, and live
here because they read the ring-buffer layout this module defines).

Why a ring buffer: transformers' `StaticSlidingWindowLayer` tracks its fill level in a Python int, which
`torch.export` bakes in as a constant, so it cannot serve a position-generic decode step. Here a sliding
layer holds `min(window, max_cache_len)` slots and token `t` always lives in slot `t % slots`; everything
position-dependent is computed from the `cache_position` tensor, inside the graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

FULL = "full_attention"
SLIDING = "sliding_attention"


@dataclass(frozen=True)
class LayerLayout:
    """One decoder layer's cache: its kind, slot count and head shapes."""

    kind: str  # FULL or SLIDING
    slots: int  # max_cache_len for FULL, min(window, max_cache_len) for SLIDING
    window: int | None  # attention window in tokens (SLIDING only)
    num_kv_heads: int
    head_dim: int

    def nbytes(self, batch: int, dtype: torch.dtype) -> int:
        """Bytes of keys plus values for `batch` sequences."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * batch * self.num_kv_heads * self.slots * self.head_dim * itemsize


def allocate(layout: tuple[LayerLayout, ...], batch: int, dtype: torch.dtype, device) -> list[torch.Tensor]:
    """Allocate the cache once, flat as [k0, v0, k1, v1, ...]; each (batch, kv_heads, slots, head_dim)."""
    tensors = []
    for layer in layout:
        shape = (batch, layer.num_kv_heads, layer.slots, layer.head_dim)
        tensors += [torch.zeros(shape, dtype=dtype, device=device) for _ in range(2)]
    return tensors


def write_token(keys, values, layout: LayerLayout, cache_position, key_states, value_states) -> None:
    """Store one decode step's keys and values (B, kv_heads, 1, head_dim) of one layer: row b's token goes
    to slot `cache_position[b]`, modulo the slot count on a ring (rows stand at different positions).
    The compiled step does this inside its graph; an ONNX step returns the states and the runtime
    calls this with them (ONNX drops in-place updates of graph inputs)."""
    slot = cache_position % layout.slots if layout.kind == SLIDING else cache_position  # (B,)
    rows = torch.arange(key_states.shape[0], device=key_states.device)  # (B,)
    keys[rows, :, slot] = key_states[:, :, 0]  # (B, kv_heads, head_dim): one slot per row
    values[rows, :, slot] = value_states[:, :, 0]


class SlotLayer(CacheLayerMixin):
    """A view over one layer's preallocated keys and values.

    Prefill (many tokens, from an empty cache) stores the tokens that the decode step will still need
    and returns the fresh states, so prompt attention covers exactly the prompt as in HF's dynamic cache.
    Decode (one token per row) writes each row's slot `position % slots` (rows stand at different
    positions) and returns the whole buffer; the caller's mask says which slots are live.
    """

    is_compileable = True

    def __init__(self, keys, values, layout: LayerLayout, cache_position: torch.Tensor | None, start: int = 0):
        super().__init__()
        self.keys, self.values = keys, values  # (B, kv_heads, slots, head_dim)
        self.layout = layout
        self.is_sliding = layout.kind == SLIDING
        self.cache_position = cache_position  # (B,) int64 in decode, one per row; None in prefill
        self.start = start  # prefill: the cache already holds indices [0, start) (a continued prefill)
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        raise RuntimeError("aotpack cache layers are allocated up front")

    def update(self, key_states, value_states, *args, **kwargs):
        if self.cache_position is None:
            return self._continue(key_states, value_states) if self.start else self._prefill(key_states, value_states)
        self.written = (key_states, value_states)  # (B, kv_heads, 1, head_dim): what a portable step returns
        write_token(self.keys, self.values, self.layout, self.cache_position, key_states, value_states)
        return self.keys, self.values

    def _prefill(self, key_states, value_states):
        self._store(key_states, value_states)
        return key_states, value_states

    def _continue(self, key_states, value_states):
        """A chunk of tokens [start, start + c) after what the cache holds: a full layer attends to its
        first start + c slots; a ring to its slots as they were before the chunk, then the chunk
        (chunk_masks builds the masks in the same order)."""
        if self.is_sliding:
            keys, values = torch.cat([self.keys, key_states], 2), torch.cat([self.values, value_states], 2)
            self._store(key_states, value_states)
            return keys, values
        self._store(key_states, value_states)
        end = self.start + key_states.shape[-2]
        return self.keys[:, :, :end], self.values[:, :, :end]

    def _store(self, key_states, value_states) -> None:
        """Write tokens [start, start + c) to their slots; a ring keeps only its last `slots` of them."""
        seq = key_states.shape[-2]
        keep = min(seq, self.layout.slots)
        slots = torch.arange(self.start + seq - keep, self.start + seq, device=key_states.device) % self.layout.slots
        self.keys.index_copy_(2, slots, key_states[:, :, seq - keep :])
        self.values.index_copy_(2, slots, value_states[:, :, seq - keep :])

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # Only prefill asks (decode passes prepared masks): attention spans the prompt alone.
        return query_length, 0

    def get_seq_length(self) -> int:
        return 0

    def get_max_length(self) -> int:
        return self.layout.slots


class SlotCache(Cache):
    """`transformers.Cache` over aotpack's tensors; `cache_position=None` means prefill, of a prompt's
    tokens from `start` on (0: from an empty cache)."""

    def __init__(
        self, tensors, layout: tuple[LayerLayout, ...], cache_position: torch.Tensor | None = None, start: int = 0
    ):
        layers = [
            SlotLayer(tensors[2 * i], tensors[2 * i + 1], layer, cache_position, start)
            for i, layer in enumerate(layout)
        ]
        super().__init__(layers=layers)


def decode_masks(pad_mask: torch.Tensor, cache_position: torch.Tensor, layout) -> dict[str, torch.Tensor]:
    """Boolean SDPA masks (B, 1, 1, slots) for one decode step, keyed by layer kind.

    pad_mask: (B, max_cache_len) bool, True where the absolute cache index holds a real token.
    cache_position: (B,) int64, the absolute index each row writes now (rows are independent).
    Slot j of a ring with n slots holds index t = p - ((p - j) mod n): the newest index <= p in that
    slot. It is live when t >= 0 and not padding, which is exactly HF's `kv_idx > q_idx - window`.
    """
    position = cache_position[:, None]  # (B, 1)
    masks = {}
    for layer in layout:
        if layer.kind in masks:
            continue
        slots = torch.arange(layer.slots, device=pad_mask.device)[None]  # (1, slots)
        if layer.kind == FULL:
            padded = pad_mask[:, : layer.slots]  # (B, slots): slot j holds index j
            live = slots <= position
        else:
            index = position - torch.remainder(position - slots, layer.slots)  # (B, slots)
            padded = pad_mask.gather(1, index.clamp(min=0))
            live = index >= 0
        masks[layer.kind] = (padded & live)[:, None, None, :]
    return masks


def chunk_masks(real: torch.Tensor, start: int, layout) -> dict[str, torch.Tensor]:
    """Boolean SDPA masks (b, 1, c, keys) for a prefill chunk of indices [start, end) continuing a cache
    that holds [0, start), keyed by layer kind, in SlotLayer._continue's key order.

    real: (b, end) bool, True where an index holds a real token (False: left padding).
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
        if layer.kind == FULL:
            keys = torch.arange(end, device=real.device)[None]  # (1, end): slot j holds index j
            visible = (keys <= query)[None] & real[:, None, :]  # (b, c, end)
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
    return model.dtype if model.config.get_text_config()._attn_implementation == "eager" else None


def mask_argument(masks: dict[str, torch.Tensor], additive_dtype: torch.dtype | None = None):
    """What a model's `attention_mask` takes: mixed-kind models read a dict per layer kind; single-kind
    models take a prepared 4D mask, which transformers' mask builders return as-is. Eager attention
    adds its mask to the scores, so it gets 0 / dtype-min floats (as transformers' eager masks) rather
    than booleans: `additive_dtype` is the model's dtype then."""
    if additive_dtype is not None:
        low = torch.finfo(additive_dtype).min
        masks = {kind: torch.zeros((), dtype=additive_dtype).masked_fill(~m, low) for kind, m in masks.items()}
    return next(iter(masks.values())) if len(masks) == 1 else masks
