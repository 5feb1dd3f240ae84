"""Eager prefill: the prompt (images included) through the HF model, once, into the shared cache.

Owns: running the model's own forward over the prompt, with HF's position ids and masks, while a
`SlotCache` writes every layer's keys and values into the shared KV tensors (a request's own rows) for
the compiled decode; `prefill_prompt`, which leaves the last prompt token to the decode step, and
`start`, which does both for one prompt alone. Prefill is never compiled: a VLM prefill (vision tower,
image merge, bidirectional image mask, prompt length that changes per request) is exactly what cannot
be captured as one static graph.

`prefill_prompt` runs all but the last prompt token eagerly through the base model, without the
`lm_head`, and leaves the last token to the compiled step. The `lm_head` is the largest weight (two thirds of Gemma 3
270M): eager ATen reads it at a third of the compiled kernel's rate in fp32, and a quantized `lm_head`
would be dequantized block by block. Only a prompt that ends in an image token (which the text-only
decode graph cannot embed) is prefilled whole.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.cache import SlotCache, additive_mask_dtype, chunk_masks, mask_argument
from runtime.rows import Rows, prompt_positions


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
    prompt's mask so far. The base model runs with aotpack's masks (runtime.cache.chunk_masks), which
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


@torch.inference_mode()
def prefill_prompt(model, kv, layout, input_ids, attention_mask, **model_inputs) -> torch.Tensor | None:
    """Put a prompt (B, S) in `kv`, all but its last token; the decode step feeds that one and returns
    the first next-token logits. A prompt ending in an image token runs whole here: returns its logits
    (B, vocab) fp32 then, else None."""
    positions = prompt_positions(attention_mask)  # (B, S)
    if ends_in_image(model, input_ids):
        return prefill(model, kv, layout, input_ids, attention_mask, positions, **model_inputs)
    if input_ids.shape[1] > 1:
        # Per-token inputs (token_type_ids, mm_token_type_ids) lose their last column with the ids.
        head = {k: _drop_last(v, input_ids.shape) for k, v in model_inputs.items()}
        prefill_states(model, kv, layout, input_ids[:, :-1], attention_mask[:, :-1], positions[:, :-1], **head)
    return None


def ends_in_image(model, input_ids: torch.Tensor) -> bool:
    """The text-only decode graph cannot embed an image token, so such a prompt is prefilled whole."""
    image_token = getattr(model.config, "image_token_id", None)
    return image_token is not None and bool((input_ids[:, -1] == image_token).any())


@torch.inference_mode()
def start(model, decode, kv, layout, input_ids, attention_mask, max_cache_len: int, **model_inputs):
    """One prompt alone in `kv` (B rows): returns (first next-token logits (B, vocab) fp32, its Rows)."""
    batch, seq = input_ids.shape
    rows = Rows(batch, max_cache_len, input_ids.device)
    scores = prefill_prompt(model, kv, layout, input_ids, attention_mask, **model_inputs)
    rows.place(slice(None), attention_mask, seq if scores is not None else seq - 1)
    if scores is None:
        rows.advance(torch.ones(batch, dtype=torch.bool, device=input_ids.device))
        scores = decode(input_ids[:, -1:].contiguous(), *rows.inputs(batch), kv).float()
    return scores, rows


def _drop_last(value, shape: torch.Size):
    """A (B, S) per-token input without its last column; anything else (pixel_values) unchanged."""
    return value[:, :-1] if isinstance(value, torch.Tensor) and value.shape == shape else value
