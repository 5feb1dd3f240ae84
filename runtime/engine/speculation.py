"""Speculative decoding with prompt lookup: what to draft, when a verify step pays, and the sampling rule.

Owns: each request's drafter (transformers' own `PromptLookupCandidateGenerator`, the n-gram lookup
behind `generate(prompt_lookup_num_tokens=...)`: the tokens that followed the latest n-gram's first
earlier occurrence in the prompt or the text so far), its acceptance record, the engine's record of what
each kind of step costs, and the decision per step: a verify step (a bundle's graph of k + 1 tokens a
row, runtime.model.step) costs more than a decode step (about 2x on a 2-core CPU at k = 4), so it runs
only when the drafts expected to be accepted make up for it. Drafts come from text the request already
holds, so free text finds few, and a drafter whose drafts keep failing backs off: free text is never
made slower than plain decoding by more than a probe now and then.

Greedy requests draft by default (their tokens are the argmax either way: output identical). Sampled
requests draft only when asked (`prompt_lookup_num_tokens`): the rejection rule below keeps their
distribution exactly, but draws other random numbers than `generate` with the same seed would.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

# The share of its drafts a drafter's request is taken to accept before it has verified any: optimistic,
# so a request that copies its input verifies from its first match on.
PRIOR_ACCEPTANCE = 0.7
# Weight of the newest verify step in a drafter's acceptance (an exponential average).
ACCEPTANCE_WEIGHT = 0.3
# Drafts follow a match of at least this many tokens: transformers' lookup falls back to a single token,
# which free text matches nearly every step and which predicts little (SmolLM2's free text drafted on
# most steps and accepted 2 % of the drafts).
MIN_NGRAM = 2
# A drafter whose drafts did not pay (the engine declined a verify step for them, or a probe failed)
# sits out BACKOFF steps, doubling after each failed probe up to MAX_BACKOFF, then probes once: free
# text pays for one wasted verify step in that many at most, and a copy that starts later is found.
BACKOFF, MAX_BACKOFF = 16, 256
# Weight of the newest timing in the engine's per-kind step cost.
COST_WEIGHT = 0.2
# A verify step must promise this much more than a decode step's rate: estimates are noisy, and a
# wasted verify step costs its whole time.
MARGIN = 1.1


class Drafter:
    """One request's drafts: up to `tokens` a step from prompt lookup over its history, adaptive."""

    def __init__(self, tokens: int, ngram: int):
        self.tokens = tokens
        self._lookup = PromptLookupCandidateGenerator(num_output_tokens=tokens, max_matching_ngram_size=ngram)
        self.acceptance = PRIOR_ACCEPTANCE
        self.resting = 0  # steps left to sit out
        self.backoff = BACKOFF
        self.probing = False  # the next drafts are verified whatever the estimate says
        self.drafted = self.accepted = 0  # totals, for metrics

    def propose(self, history: torch.Tensor, room: int) -> torch.Tensor | None:
        """Drafted ids (d,) to follow `history` (1, S), at most `room` of them; None: none this step."""
        if self.resting:
            self.resting -= 1
            self.probing = not self.resting
            return None
        if room < 1 or not _seen(history[0], min(MIN_NGRAM, self._lookup.max_matching_ngram_size)):
            return None
        self._lookup.max_length = history.shape[1] + room + 1
        candidates, _ = self._lookup.get_candidates(history)
        drafts = candidates[0, history.shape[1] :]
        return drafts[:room] if drafts.numel() else None

    def expected(self, drafts: int) -> float:
        """Tokens a verify step is expected to give this row: its own next token and the share of its
        drafts it has been accepting (all of them when probing)."""
        return 1.0 + drafts * (1.0 if self.probing else self.acceptance)

    def record(self, drafted: int, accepted: int) -> None:
        """A verify step took `accepted` of this row's `drafted` tokens."""
        self.drafted += drafted
        self.accepted += accepted
        self.acceptance = (1 - ACCEPTANCE_WEIGHT) * self.acceptance + ACCEPTANCE_WEIGHT * accepted / drafted
        if self.probing:
            self.probing = False
            failed = accepted == 0
            self.backoff = min(2 * self.backoff, MAX_BACKOFF) if failed else BACKOFF
            self.acceptance = self.acceptance if failed else max(self.acceptance, PRIOR_ACCEPTANCE)

    def declined(self) -> None:
        """The engine judged this row's drafts not worth a verify step: rest, then probe."""
        self.resting = self.backoff


def _seen(ids: torch.Tensor, n: int) -> bool:
    """Whether the last `n` of `ids` (S,) occurred earlier in them."""
    if ids.shape[0] <= n:
        return False
    return bool((ids[:-1].unfold(0, n, 1) == ids[-n:]).all(1).any())


@dataclass
class StepCosts:
    """Seconds a decode and a verify step of each batch took lately, measured by the engine."""

    seconds: dict[tuple[str, int], float] = field(default_factory=dict)

    def timed(self, kind: str, batch: int, start: float) -> None:
        took, key = time.perf_counter() - start, (kind, batch)
        old = self.seconds.get(key)
        self.seconds[key] = took if old is None else (1 - COST_WEIGHT) * old + COST_WEIGHT * took

    def pays(self, decode_batch: int, verify_batch: int, rows: int, expected: float) -> bool:
        """Whether a verify step (its graph's batch), expected to give `expected` tokens in all to `rows`
        decoding rows, beats a decode step's `rows` tokens per second. Unmeasured: try it (and so measure)."""
        decode, verify = self.seconds.get(("decode", decode_batch)), self.seconds.get(("verify", verify_batch))
        if decode is None or verify is None:
            return True
        return expected / verify > MARGIN * rows / decode


def draft_tokens(requested: int | None, bundle: int, sampled: bool) -> int:
    """Drafts a request may take a step: `prompt_lookup_num_tokens` (None: the bundle's k for greedy
    requests, none for sampled ones), at most the bundle's k; 0 without verify graphs."""
    if not bundle:
        return 0
    if requested is None:
        return 0 if sampled else bundle
    return min(requested, bundle)


def rejection_sample(probs: torch.Tensor, draft: int, generator: torch.Generator | None) -> torch.Tensor:
    """A token (1,) from `probs` (1, vocab) given a drafted token, by the standard rule (Leviathan et al.
    2023) for a draft that proposed `draft` with certainty: accept it with probability p(draft), else draw
    from p with the draft removed, renormalised. The result is distributed exactly as p."""
    u = torch.rand((), generator=generator, device=probs.device)
    if bool(u < probs[0, draft]):
        return torch.tensor([draft], device=probs.device)
    rest = probs.clone()
    rest[0, draft] = 0.0  # not all zero: u < p(draft) = 1 would have accepted
    return torch.multinomial(rest, num_samples=1, generator=generator).squeeze(1)
