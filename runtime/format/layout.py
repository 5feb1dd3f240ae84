"""The KV cache's layout per decoder layer: full-length or a sliding ring buffer.

Owns: what each layer's cache holds (kind, slots, window, head shapes) and how many bytes that is.
Why a ring buffer: transformers' `StaticSlidingWindowLayer` tracks its fill level in a Python int, which
`torch.export` bakes in as a constant, so it cannot serve a position-generic decode step. Here a sliding
layer holds `min(window + k, max_cache_len)` slots and token `t` always lives in slot `t % slots`
(runtime.model.cache writes it; runtime.model.masks reads it, live within the window). `k` is what a
step writes at once beyond a row's next token: a bundle's draft tokens (speculative decoding: a verify
step writes a row's next k + 1 tokens before any is accepted), or its chunk graph's C tokens less one
(all written before its first query attends), whichever is more; 0 without either. With k slots to
spare, every slot a step overwrites held a token that no query of the step, or later, has in its window.
"""

from __future__ import annotations

from dataclasses import dataclass

FULL = "full_attention"
SLIDING = "sliding_attention"
KINDS = (FULL, SLIDING)

ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}  # bytes per element of each bundle dtype


@dataclass(frozen=True)
class LayerLayout:
    """One decoder layer's cache: its kind, slot count and head shapes."""

    kind: str  # FULL or SLIDING
    slots: int  # max_cache_len for FULL, min(window + k, max_cache_len) for SLIDING (k: see above)
    window: int | None  # attention window in tokens (SLIDING only)
    num_kv_heads: int
    head_dim: int

    @property
    def allocated(self) -> int:
        """Slots allocated: one more than the layer uses. The spare slot is never written or read; it
        keeps every view of the attended slots non-contiguous, whatever the span, so that export does not
        specialise a dynamic span to the one size (the whole layer) at which that view would be
        contiguous (torch asks for views' contiguity while tracing, and guards on the answer)."""
        return self.slots + 1

    def nbytes(self, batch: int, dtype: str) -> int:
        """Bytes of keys plus values for `batch` sequences in `dtype` (a bundle dtype name)."""
        return 2 * batch * self.num_kv_heads * self.allocated * self.head_dim * ITEMSIZE[dtype]

    def shape(self, batch: int) -> tuple[int, int, int, int]:
        """(batch, kv_heads, allocated slots, head_dim): each of the layer's key and value tensors."""
        return (batch, self.num_kv_heads, self.allocated, self.head_dim)
