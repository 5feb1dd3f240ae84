"""One request's generation state: what it has generated and whether it is done.

Owns: choosing a request's next tokens from its logits exactly as HF `generate` does (transformers' own
logits processors over the request's history, greedy or sampled with the request's own generator,
finished rows padded with the pad id, transformers' own stopping criteria ending rows: length, time,
stop strings, eos, the caller's), and its length budget. The engine calls it once per step with the
logits of the request's own cache rows.
"""

from __future__ import annotations

import torch

from runtime.generate import Request
from runtime.sampling import next_token


class Sequence:
    """A request running in cache rows `rows` (one row per sequence of its batch)."""

    def __init__(self, request: Request, rows: slice):
        self.request = request
        self.rows = rows
        self.history = request.input_ids  # (b, S + steps): what the processors see, as in generate
        self.unfinished = torch.ones(request.input_ids.shape[0], dtype=torch.bool, device=request.input_ids.device)
        # HF pads finished rows only when an eos criterion can finish one early
        self.pads = any(hasattr(c, "eos_token_id") for c in request.stopping)
        self.scores: list[torch.Tensor] = []  # processed scores per step, when the request returns them
        self.steps = 0
        self.fed = 0  # prompt tokens in the cache so far
        self.decoding = False  # True once the whole prompt but its last token is in the cache

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (b, vocab) raw fp32 -> the next token ids (b,); finished rows get the pad id."""
        r = self.request
        scores = r.processors(self.history, logits.clone())  # (b, vocab)
        token = next_token(scores, r.config.do_sample, r.generator)
        if self.pads:
            token = torch.where(self.unfinished, token, torch.full_like(token, r.pad_id))  # (b,)
        self.history = torch.cat([self.history, token[:, None]], dim=-1)
        if r.keeps_scores:
            self.scores.append(scores)
        # as in generate: the criteria read the history with the new token, and the scores HF keeps
        self.unfinished &= ~r.stopping(self.history, tuple(self.scores) if r.keeps_scores else None)
        self.steps += 1
        return token

    @property
    def done(self) -> bool:
        return self.steps >= self.request.config.max_new_tokens or not bool(self.unfinished.any())
