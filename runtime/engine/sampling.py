"""Choosing the next token: pure functions over logits, randomness only through an explicit generator.

Owns: greedy and multinomial choice. The logits processors that run before it are transformers' own
(runtime.compat.logits_processors), so temperature, top-k, top-p, repetition penalty and friends mean
exactly what they mean in `model.generate`.
"""

from __future__ import annotations

import torch

from runtime.errors import InvalidInputError


def greedy(scores: torch.Tensor) -> torch.Tensor:
    """scores (B, vocab) -> token ids (B,)."""
    return scores.argmax(dim=-1)


def sample(scores: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """scores (B, vocab), already warped -> token ids (B,), drawn with `generator`."""
    probs = torch.softmax(scores, dim=-1)  # (B, vocab)
    if not bool(torch.isfinite(probs).all()):  # multinomial would raise a bare RuntimeError
        raise InvalidInputError(
            "the sampling distribution holds NaN or inf: the scores overflowed float32 (a temperature as small "
            "as 1e-300 does that) or a logits processor produced NaN; use a temperature >= 1e-5, or greedy "
            "decoding (do_sample=False)"
        )
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


def next_token(scores: torch.Tensor, do_sample: bool, generator: torch.Generator | None) -> torch.Tensor:
    return sample(scores, generator) if do_sample else greedy(scores)
