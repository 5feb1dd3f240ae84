"""Speculative decoding with prompt lookup: what to draft, when a verify step pays, and the sampling rule.

Owns: each request's drafter (transformers' own `PromptLookupCandidateGenerator`, the n-gram lookup
behind `generate(prompt_lookup_num_tokens=...)`: the tokens that followed the latest n-gram's first
earlier occurrence in the prompt or the text so far), its acceptance record, the engine's record of what
each kind of step costs, and the decision per step: a verify step (a bundle's graph of k + 1 tokens a
row, runtime.model.step) costs more than a decode step (about 2x on a 2-core CPU at k = 4), so it runs
only when the drafts expected to be accepted make up for it. Drafts come from text the request already
holds, so free text finds few, and drafts that fail, verified or not (a declined draft is scored against
the tokens decoded next), lower what its drafter promises: free text is never made slower than plain
decoding by more than the few verify steps its first matches cost.

Greedy requests draft by default (their tokens are the argmax either way: output identical). Sampled
requests draft only when asked (`prompt_lookup_num_tokens`): the rejection rule below keeps their
distribution exactly, but draws other random numbers than `generate` with the same seed would.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

# The share of its drafts a drafter's request is taken to accept before anything is known: optimistic,
# so a request that copies its input verifies from its first match on.
PRIOR_ACCEPTANCE = 0.7
# Weight of the newest outcome in a drafter's acceptance (an exponential average).
ACCEPTANCE_WEIGHT = 0.3
# Drafts follow a match of at least this many tokens: transformers' lookup falls back to a single token,
# which free text matches nearly every step and which predicts little (SmolLM2's free text drafted on
# most steps and accepted 2 % of the drafts).
MIN_NGRAM = 2
# Weight of the newest timing in the engine's per-kind step cost.
COST_WEIGHT = 0.2
# A verify step must promise this much more than a decode step's rate: estimates are noisy, and a
# wasted verify step costs its whole time.
MARGIN = 1.1


class Drafter:
    """One request's drafts: up to `tokens` a step from prompt lookup over its history, and how many of
    them it can be expected to accept.

    Drafts the engine declines are still scored: against the tokens plain decoding then gives (shadow
    drafts, free to check). So a drafter learns its acceptance whether or not its drafts are verified,
    proposes every step it finds a match, and the engine weighs all rows' drafts at once. Resting a
    declined drafter instead (a rest of 16 to 256 steps, then one optimistic probe) starved busy batches:
    the rows' rests fell out of step, a step rarely saw more than one row's drafts, and at 8 rows of
    SmolLM2 the engine ran 4 to 20 verify steps in 1,191-1,345 while 6 of the 8 requests copied their input."""

    def __init__(self, tokens: int, ngram: int):
        self.tokens = tokens
        self._lookup = PromptLookupCandidateGenerator(num_output_tokens=tokens, max_matching_ngram_size=ngram)
        self.acceptance = PRIOR_ACCEPTANCE
        self._shadow: tuple[int, torch.Tensor] | None = None  # (history length then, drafts) being scored
        self.drafted = self.accepted = 0  # verified totals, for metrics

    def propose(self, history: torch.Tensor, room: int) -> torch.Tensor | None:
        """Drafted ids (d,) to follow `history` (1, S), at most `room` of them; None: none this step."""
        self._score_shadow(history[0])
        if room < 1 or not _seen(history[0], min(MIN_NGRAM, self._lookup.max_matching_ngram_size)):
            return None
        self._lookup.max_length = history.shape[1] + room + 1
        candidates, _ = self._lookup.get_candidates(history)
        drafts = candidates[0, history.shape[1] :]
        return drafts[:room] if drafts.numel() else None

    def expected(self, drafts: int) -> float:
        """Tokens a verify step is expected to give this row: its own next token and the share of its
        drafts it has been accepting."""
        return 1.0 + drafts * self.acceptance

    def record(self, drafted: int, accepted: int) -> None:
        """A verify step took `accepted` of this row's `drafted` tokens."""
        self.drafted += drafted
        self.accepted += accepted
        self._learn(drafted, accepted)

    def declined(self, drafts: torch.Tensor, at: int) -> None:
        """The engine did not verify `drafts` (d,), proposed after `at` tokens of history: score them
        against the tokens decoded next (one shadow at a time: a sample is enough)."""
        if self._shadow is None:
            self._shadow = (at, drafts)

    def _score_shadow(self, ids: torch.Tensor) -> None:
        """Once decoding has shown whether the shadow drafts would have been taken (a token differed, or
        all of them came), count them in the acceptance."""
        if self._shadow is None:
            return
        at, drafts = self._shadow
        came = ids[at : at + drafts.shape[0]]  # (n,) decoded since, at most d
        differs = (came != drafts[: came.shape[0]]).nonzero()
        if differs.numel() or came.shape[0] == drafts.shape[0]:
            self._learn(drafts.shape[0], int(differs[0]) if differs.numel() else drafts.shape[0])
            self._shadow = None

    def _learn(self, drafted: int, accepted: int) -> None:
        self.acceptance = (1 - ACCEPTANCE_WEIGHT) * self.acceptance + ACCEPTANCE_WEIGHT * accepted / drafted


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
