"""Choosing the next token: pure functions over logits, randomness only through an explicit generator.

Owns: greedy and multinomial choice, and the logits processors. The processors are transformers' own,
built from the bundle's generation config merged with the call's overrides, so temperature, top-k,
top-p, repetition penalty and friends mean exactly what they mean in `model.generate`.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig
from transformers.generation import LogitsProcessorList


def greedy(scores: torch.Tensor) -> torch.Tensor:
    """scores (B, vocab) -> token ids (B,)."""
    return scores.argmax(dim=-1)


def sample(scores: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """scores (B, vocab), already warped -> token ids (B,), drawn with `generator`."""
    probs = torch.softmax(scores, dim=-1)  # (B, vocab)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


def next_token(scores: torch.Tensor, do_sample: bool, generator: torch.Generator | None) -> torch.Tensor:
    return sample(scores, generator) if do_sample else greedy(scores)


def logits_processors(model, config: GenerationConfig, prompt_len: int, device) -> LogitsProcessorList:
    """transformers' processor list for `config`, exactly as `generate` would build it."""
    # A private helper, but it is the single source of truth for what each generation option does;
    # re-implementing it would drift from HF semantics. transformers is pinned in pyproject.toml.
    return model._get_logits_processor(
        generation_config=config, input_ids_seq_length=prompt_len, device=device, model_kwargs={}
    )
