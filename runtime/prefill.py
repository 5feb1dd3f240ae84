"""Eager prefill: the prompt (images included) through the HF model, once, into the shared cache.

Owns: running the model's own forward over the prompt, with HF's position ids and masks, while a
`SlotCache` writes every layer's keys and values into the shared KV tensors for the compiled decode,
and `start`, which turns a prompt into the first next-token logits. Prefill is never compiled: a VLM
prefill (vision tower, image merge, bidirectional image mask, prompt length that changes per request)
is exactly what cannot be captured as one static graph.

`start` runs all but the last prompt token eagerly through the base model, without the `lm_head`, and
the last token through the compiled step. The `lm_head` is the largest weight (two thirds of Gemma 3
270M): eager ATen reads it at a third of the compiled kernel's rate in fp32, and a quantized `lm_head`
would be dequantized block by block. Only a prompt that ends in an image token (which the text-only
decode graph cannot embed) is prefilled whole.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.cache import SlotCache


def prompt_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Rotary positions for a left-padded batch, as HF generate computes them: (B, S) int64."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.masked_fill(attention_mask == 0, 0)


class DecodeCursor:
    """Where decoding stands after a prompt: the padding mask over absolute cache slots and each row's
    rotary position. `advance()` admits one more token and returns that token's decode-step inputs."""

    def __init__(self, attention_mask: torch.Tensor, max_cache_len: int, fed: int | None = None):
        """`fed`: how many of the prompt's tokens are in the cache already (default: all of them); the
        next `advance()` admits token `fed`, which may still be a prompt token."""
        batch, seq = attention_mask.shape
        self.seq = seq if fed is None else fed
        self.prompt_positions = prompt_positions(attention_mask)  # (B, S), for prefill
        self.pad_mask = torch.zeros(batch, max_cache_len, dtype=torch.bool, device=attention_mask.device)  # (B, L)
        self.pad_mask[:, : self.seq] = attention_mask[:, : self.seq].bool()
        self.position = self.prompt_positions[:, -1:] - (seq - self.seq)  # (B, 1): the last fed token's
        self.steps = 0

    def advance(self) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (position_ids (B, 1), cache_position (1,)) of the next token fed to the decode step."""
        index = self.seq + self.steps
        self.steps += 1
        self.pad_mask[:, index] = True
        self.position = self.position + 1
        return self.position, torch.tensor([index], device=self.pad_mask.device)


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


def _forward(module: nn.Module, kv, layout, input_ids, attention_mask, position_ids, **model_inputs):
    """One HF forward over the prompt, with the shared KV tensors as its cache."""
    return module(
        input_ids=input_ids,  # (B, S)
        attention_mask=attention_mask,  # (B, S)
        position_ids=position_ids,  # (B, S)
        cache=SlotCache(kv, layout),
        use_cache=True,
        **model_inputs,  # e.g. pixel_values, token_type_ids for a VLM; logits_to_keep for the full model
    )


@torch.inference_mode()
def start(model, decode, kv, layout, input_ids, attention_mask, max_cache_len: int, **model_inputs):
    """Put the prompt in `kv`; returns (first next-token logits (B, vocab) fp32, the DecodeCursor)."""
    seq = input_ids.shape[1]
    image_token = getattr(model.config, "image_token_id", None)
    if image_token is not None and bool((input_ids[:, -1] == image_token).any()):
        cursor = DecodeCursor(attention_mask, max_cache_len)
        return prefill(model, kv, layout, input_ids, attention_mask, cursor.prompt_positions, **model_inputs), cursor
    cursor = DecodeCursor(attention_mask, max_cache_len, fed=seq - 1)
    if seq > 1:
        # Per-token inputs (token_type_ids, mm_token_type_ids) lose their last column with the ids.
        head = {k: _drop_last(v, input_ids.shape) for k, v in model_inputs.items()}
        prefill_states(
            model, kv, layout, input_ids[:, :-1], attention_mask[:, :-1], cursor.prompt_positions[:, :-1], **head
        )
    position, index = cursor.advance()
    return decode(input_ids[:, -1:].contiguous(), position, index, cursor.pad_mask, kv).float(), cursor


def _drop_last(value, shape: torch.Size):
    """A (B, S) per-token input without its last column; anything else (pixel_values) unchanged."""
    return value[:, :-1] if isinstance(value, torch.Tensor) and value.shape == shape else value
