"""Eager prefill: the prompt (images included) through the HF model, into the shared cache.

Owns: running the model's own forward over prompt tokens, with HF's position ids and masks, while a
`SlotCache` writes every layer's keys and values into the shared KV tensors (a request's own rows) for
the compiled decode: from an empty cache (`prefill`, `prefill_states`), or continuing one with
aotpack's own masks (`prefill_more`, text only). Prefill is never compiled: a VLM prefill (vision
tower, image merge, bidirectional image mask, prompt length that changes per request) is exactly what
cannot be captured as one static graph.

The engine (runtime.engine.runner) leaves the last prompt token to the decode step, so the prompt runs
through the base model without the `lm_head`. The `lm_head` is the largest weight (two thirds of Gemma 3
270M): eager ATen reads it at a third of the compiled kernel's rate in fp32, and a quantized `lm_head`
would be dequantized block by block. Only a prompt that ends in an image token (which the text-only
decode graph cannot embed) runs whole, `lm_head` included (`prefill`).
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.model.cache import SlotCache
from runtime.model.masks import additive_mask_dtype, chunk_masks, mask_argument
from runtime.model.positions import prompt_positions


@torch.inference_mode()
def prefill(model: nn.Module, kv, layout, input_ids, attention_mask, position_ids, **model_inputs) -> torch.Tensor:
    """Run the prompt; returns the next-token logits (B, vocab) in fp32 and leaves the prompt in `kv`."""
    out = _forward(model, kv, layout, input_ids, attention_mask, position_ids, logits_to_keep=1, **model_inputs)
    return out.logits[:, -1].float()  # (B, vocab)


@torch.inference_mode()
def prefill_states(model: nn.Module, kv, layout, input_ids, attention_mask, position_ids, **model_inputs) -> None:
    """Run the prompt through the base model (no lm_head), leaving its keys and values in `kv`."""
    base = getattr(model, model.base_model_prefix)
    _forward(base, kv, layout, input_ids, attention_mask, position_ids, **model_inputs)


@torch.inference_mode()
def prefill_more(model: nn.Module, kv, layout, input_ids, attention_mask, start: int) -> None:
    """Continue a cache that holds a prompt's indices [0, start) with its next tokens, text only.

    input_ids: (B, c), the prompt's tokens [start, start + c); attention_mask: (B, start + c), the
    prompt's mask so far. The base model runs with aotpack's masks (runtime.model.masks.chunk_masks), which
    reach back into the cache, sliding rings included."""
    masks = mask_argument(chunk_masks(attention_mask.bool(), start, layout), additive_mask_dtype(model))
    positions = prompt_positions(attention_mask)[:, start:]  # (B, c)
    base = getattr(model, model.base_model_prefix)
    _forward(base, kv, layout, input_ids, masks, positions, start=start)


def _forward(module: nn.Module, kv, layout, input_ids, attention_mask, position_ids, start=0, **model_inputs):
    """One HF forward over prompt tokens from index `start` on, with the shared KV tensors as its cache."""
    return module(
        input_ids=input_ids,  # (B, S)
        attention_mask=attention_mask,  # (B, S), or prepared masks when continuing
        position_ids=position_ids,  # (B, S)
        cache=SlotCache(kv, layout, start=start),
        use_cache=True,
        **model_inputs,  # e.g. pixel_values, token_type_ids for a VLM; logits_to_keep for the full model
    )


def head_inputs(model_inputs: dict, shape: torch.Size, end: int) -> dict:
    """Per-token inputs (token_type_ids, mm_token_type_ids: (B, S) like the ids) cut to the prompt's first
    `end` tokens; anything else (pixel_values) unchanged."""
    return {k: v[:, :end] if isinstance(v, torch.Tensor) and v.shape == shape else v for k, v in model_inputs.items()}
