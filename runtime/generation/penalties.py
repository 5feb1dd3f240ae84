"""OpenAI's frequency and presence penalties, as a transformers logits processor.

Owns: the additive definition of OpenAI's API (and vLLM's): each token's logit minus `frequency` times
how often the request has generated it so far, minus `presence` once it has generated it at all. It
is not HF's `repetition_penalty`, which divides (or multiplies) the scores of every token seen, prompt
included; transformers has no additive one, so it is written here.
"""

from __future__ import annotations

import torch
from transformers.generation import LogitsProcessor


class AdditivePenalties(LogitsProcessor):
    def __init__(self, frequency: float, presence: float, prompt_len: int):
        """`prompt_len`: the (padded) prompt's length; the tokens after it are the generated ones."""
        self.frequency, self.presence, self.prompt_len = float(frequency), float(presence), prompt_len

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids[:, self.prompt_len :]  # (b, n)
        if generated.shape[1] == 0:
            return scores
        counts = torch.zeros_like(scores).scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)  # (b, vocab)
