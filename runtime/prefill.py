"""Eager prefill: the whole prompt (images included) through the full HF model, once.

Owns: running the model's own forward over the prompt, with HF's position ids and masks, while a
`SlotCache` writes every layer's keys and values into the shared KV tensors for the compiled decode.
Prefill is never compiled: a VLM prefill (vision tower, image merge, bidirectional image mask, prompt
length that changes per request) is exactly what cannot be captured as one static graph.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.cache import SlotCache


def prompt_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Rotary positions for a left-padded batch, as HF generate computes them: (B, S) int64."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.masked_fill(attention_mask == 0, 0)


@torch.inference_mode()
def prefill(model: nn.Module, kv, layout, input_ids, attention_mask, position_ids, **model_inputs) -> torch.Tensor:
    """Run the prompt; returns the next-token logits (B, vocab) in fp32 and leaves the prompt in `kv`."""
    out = model(
        input_ids=input_ids,  # (B, S)
        attention_mask=attention_mask,  # (B, S)
        position_ids=position_ids,  # (B, S)
        cache=SlotCache(kv, layout),
        use_cache=True,
        logits_to_keep=1,
        **model_inputs,  # e.g. pixel_values, token_type_ids for a VLM
    )
    return out.logits[:, -1].float()  # (B, vocab)
