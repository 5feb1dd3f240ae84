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


class DecodeCursor:
    """Where decoding stands after a prompt: the padding mask over absolute cache slots and each row's
    rotary position. `advance()` admits one more token and returns that token's decode-step inputs."""

    def __init__(self, attention_mask: torch.Tensor, max_cache_len: int):
        batch, self.seq = attention_mask.shape
        self.prompt_positions = prompt_positions(attention_mask)  # (B, S), for prefill
        self.pad_mask = torch.zeros(batch, max_cache_len, dtype=torch.bool, device=attention_mask.device)  # (B, L)
        self.pad_mask[:, : self.seq] = attention_mask.bool()
        self.position = self.prompt_positions[:, -1:]  # (B, 1)
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
