"""The KV cache aotpack shares between eager prefill and the compiled decode step.

Owns: allocating the tensors once (runtime.format.layout says what each layer holds: full-length or a
sliding ring buffer, token `t` in slot `t % slots`), writing a decode step's keys and values, and the
`transformers.Cache` view that prefill and the traced decode step write through. Everything
position-dependent is computed from the `cache_position` tensor, inside the graph.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from runtime.format.layout import SLIDING, LayerLayout


def attended_slots(layer: LayerLayout, span):
    """How many of a layer's slots a decode step over cache indices [0, span) reads: the first `span` of
    a full layer; of a ring, the same while no row has wrapped (span <= slots), else all of them. `span`
    may be a symbolic size while tracing: `sym_min` keeps it symbolic instead of guarding on it."""
    return torch.sym_min(span, layer.slots) if layer.kind == SLIDING else span


def in_order(end: int, slots: int) -> bool:
    """Whether a ring of `slots` holding cache indices [0, end) has them in slots [0, end), in order."""
    return end <= slots


def allocate(layout: tuple[LayerLayout, ...], batch: int, dtype: torch.dtype, device) -> list[torch.Tensor]:
    """Allocate the cache once, flat as [k0, v0, k1, v1, ...]; each (batch, kv_heads, slots, head_dim)."""
    return [torch.zeros(layer.shape(batch), dtype=dtype, device=device) for layer in layout for _ in range(2)]


def write_token(keys, values, layout: LayerLayout, cache_position, key_states, value_states) -> None:
    """Store one step's keys and values (B, kv_heads, T, head_dim) of one layer: row b's token t goes to
    index `cache_position[b] + t`, in its slot modulo the slot count on a ring (rows stand at different
    positions; T > 1 in a verify step, its drafted tokens after the row's next one).
    The compiled step does this inside its graph; an ONNX step returns the states and the runtime
    calls this with them (ONNX drops in-place updates of graph inputs)."""
    tokens = key_states.shape[2]
    rows = torch.arange(key_states.shape[0], device=key_states.device)  # (B,)
    if tokens > 1:
        index = cache_position[:, None] + torch.arange(tokens, device=key_states.device)  # (B, T)
        slot = index % layout.slots if layout.kind == SLIDING else index
        keys[rows[:, None], :, slot] = key_states.transpose(1, 2)  # (B, T, kv_heads, head_dim)
        values[rows[:, None], :, slot] = value_states.transpose(1, 2)
        return
    slot = cache_position % layout.slots if layout.kind == SLIDING else cache_position  # (B,)
    keys[rows, :, slot] = key_states[:, :, 0]  # (B, kv_heads, head_dim): one slot per row
    values[rows, :, slot] = value_states[:, :, 0]


class SlotLayer(CacheLayerMixin):
    """A view over one layer's preallocated keys and values.

    Prefill (many tokens, from an empty cache) stores the tokens that the decode step will still need
    and returns the fresh states, so prompt attention covers exactly the prompt as in HF's dynamic cache.
    Decode (one token per row, or a verify step's few) writes each row's slots `position % slots` (rows
    stand at different positions) and returns the slots the step attends to (`attended_slots`: those of cache indices
    [0, span)); the caller's mask says which of them are live.
    """

    is_compileable = True

    def __init__(
        self, keys, values, layout: LayerLayout, cache_position: torch.Tensor | None, start: int = 0, span=None
    ):
        super().__init__()
        self.keys, self.values = keys, values  # (B, kv_heads, slots + 1 spare, head_dim)
        self.layout = layout
        self.is_sliding = layout.kind == SLIDING
        self.cache_position = cache_position  # (B,) int64 in decode, one per row; None in prefill
        self.start = start  # prefill: the cache already holds indices [0, start) (a continued prefill)
        self.span = span  # decode: the step attends to cache indices [0, span)
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        raise RuntimeError("aotpack cache layers are allocated up front")

    def update(self, key_states, value_states, *args, **kwargs):
        if self.cache_position is None:
            return self._continue(key_states, value_states) if self.start else self._prefill(key_states, value_states)
        self.written = (key_states, value_states)  # (B, kv_heads, T, head_dim): what a portable step returns
        write_token(self.keys, self.values, self.layout, self.cache_position, key_states, value_states)
        # narrow, not a slice: a slice's clamp (`end >= size`) would make export specialise a span traced
        # at the cache's length to that length
        n = attended_slots(self.layout, self.span)
        return self.keys.narrow(2, 0, n), self.values.narrow(2, 0, n)  # (B, kv_heads, n, head_dim) views

    def _prefill(self, key_states, value_states):
        self._store(key_states, value_states)
        return key_states, value_states

    def _continue(self, key_states, value_states):
        """A chunk of tokens [start, start + c) after what the cache holds: a full layer, or a ring the
        chunk does not wrap (start + c <= slots: index t is still in slot t), attends to its first
        start + c slots; a ring that wraps, to its slots as they were before the chunk, then the chunk
        (chunk_masks builds the masks in the same order). Copying a whole ring for every chunk cost
        1.4 ms of an 18 ms 8-token chunk (Gemma 3 270M int8), and attending to its 512 slots when a
        prompt held a few more."""
        end = self.start + key_states.shape[-2]
        if self.is_sliding and not in_order(end, self.layout.slots):
            n = self.layout.slots  # the spare slot stays out
            keys = torch.cat([self.keys[:, :, :n], key_states], 2)
            values = torch.cat([self.values[:, :, :n], value_states], 2)
            self._store(key_states, value_states)
            return keys, values
        self._store(key_states, value_states)
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
    tokens from `start` on (0: from an empty cache); a decode step attends to indices [0, span)."""

    def __init__(self, tensors, layout: tuple[LayerLayout, ...], cache_position=None, start: int = 0, span=None):
        layers = [
            SlotLayer(tensors[2 * i], tensors[2 * i + 1], layer, cache_position, start, span)
            for i, layer in enumerate(layout)
        ]
        super().__init__(layers=layers)
