"""One request's generation state: what it has generated and whether it is done.

Owns: choosing a request's next tokens from its logits exactly as HF `generate` does (transformers' own
logits processors over the request's history, greedy or sampled with the request's own generator,
finished rows padded with the pad id, eos and stop strings ending rows), and its length budget. The
engine calls it once per step with the logits of the request's own cache rows.
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
        self.eos = torch.tensor(request.eos_ids, dtype=torch.long, device=request.input_ids.device)
        self.steps = 0
        self.fed = 0  # prompt tokens in the cache so far
        self.decoding = False  # True once the whole prompt but its last token is in the cache

    def choose(self, scores: torch.Tensor) -> torch.Tensor:
        """scores (b, vocab) raw fp32 logits -> the next token ids (b,); finished rows get the pad id."""
        r = self.request
        token = next_token(r.processors(self.history, scores.clone()), r.config.do_sample, r.generator)
        token = torch.where(self.unfinished, token, torch.full_like(token, r.pad_id))  # (b,)
        self.history = torch.cat([self.history, token[:, None]], dim=-1)
        self.unfinished &= ~torch.isin(token, self.eos)
        if r.stopping is not None:  # HF's StopStringCriteria reads the history including the new token
            self.unfinished &= ~r.stopping(self.history, scores)
        self.steps += 1
        return token

    @property
    def done(self) -> bool:
        return self.steps >= self.request.config.max_new_tokens or not bool(self.unfinished.any())
