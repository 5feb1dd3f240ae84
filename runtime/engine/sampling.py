"""Choosing the next token: pure functions over logits, randomness only through an explicit generator.

Owns: greedy and multinomial choice, and the two samplers a request can ask for (Request.sampler). The
logits processors that run before it are transformers' own (runtime.compat.logits_processors), so
temperature, top-k, top-p, repetition penalty and friends mean exactly what they mean in `model.generate`.

- "hf" (rt.generate's default): the draws `generate` makes. torch.multinomial draws one exponential per
  vocabulary entry and HF's top-p warper sorts the whole vocabulary, so at Gemma 3's 262k a sampled token
  costs more than a decode step (see the README's sampling figures); in exchange `torch.manual_seed`
  reproduces HF's samples.
- "top-k" (serve's and the command line's, unless a seed asks for "hf"): when HF's TopKLogitsWarper is
  in the list and only warpers that rank its survivors by value follow it (temperature, top-p, min-p),
  those warpers run over the k survivors and the draw is among them. HF's top-k leaves exactly those k
  tokens (with no tie at the k-th score) and -inf elsewhere, which the warpers after it and the softmax
  give probability 0: the same distribution, up to float summation order, drawn with other random
  numbers. A tie at the k-th score (HF keeps every tied token) takes the "hf" path for that step.
  When the processors before top-k only rescale (temperature), they run over the survivors, and the
  engine takes one topk over the step's rows for every such request (shared_top_k); with a grammar
  among them, its mask is read over a pool of 2(k + 1) of them (runtime.generation.grammar, _pooled).
  -inf survivors go last (survivors_distribution), so the same finite survivors draw the same token.
"""

from __future__ import annotations

import torch
from transformers.generation import LogitsProcessorList
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from runtime.errors import InvalidInputError
from runtime.generation.options import finite_real

SAMPLERS = ("hf", "top-k")
_RANKING = (TopKLogitsWarper, TemperatureLogitsWarper, TopPLogitsWarper, MinPLogitsWarper)  # values only
_BLOCK = 128  # vocabulary entries a block of the blocked top-k: Gemma 3's 262,144 are 2,048 blocks
_SMALL_VOCABULARY = 32_768  # a topk over this many entries a row costs little at any k


def greedy(scores: torch.Tensor) -> torch.Tensor:
    """scores (B, vocab) -> token ids (B,): each row's first maximum, a NaN counting as the maximum, as
    torch's argmax decides. NumPy's argmax for float32 on the CPU: ATen's reads a row of 262k logits
    single-threaded at ~3 GB/s here (0.30 ms a row; 2.4 ms for 8) against NumPy's vectorised 0.03 ms.
    Several rows of a large vocabulary go by blocks (_blocked_argmax)."""
    if scores.device.type == "cpu" and scores.dtype == torch.float32 and scores.dim() == 2 and scores.shape[1]:
        if scores.shape[0] > 1 and scores.shape[1] >= _SMALL_VOCABULARY:
            return _blocked_argmax(scores.detach())
        # int64 already (NumPy's intp on 64-bit Linux): each torch call after a step costs ~10 us
        found = torch.from_numpy((scores.detach() if scores.requires_grad else scores).numpy().argmax(-1))
        return found if found.dtype == torch.long else found.to(torch.long)
    return scores.argmax(dim=-1)


def _blocked_argmax(scores: torch.Tensor) -> torch.Tensor:
    """scores (B, vocab) float32 on the CPU -> each row's first maximum (B,): the first block whose maximum
    is the row's (ATen's amax, one pass over every row in the step's threads; a NaN propagates, so the
    first block holding one), then NumPy's argmax inside it. The first maximum lies in the first block
    that holds it, at its first place there. 8 rows of 262k logits not in cache: 0.5-0.6 ms against
    NumPy's one thread's 0.8 (Intel Xeon, 2 threads)."""
    rows, vocab = scores.shape
    whole = vocab // _BLOCK * _BLOCK
    maxima = scores[:, :whole].reshape(rows, whole // _BLOCK, _BLOCK).amax(-1)  # (B, blocks)
    if whole < vocab:
        maxima = torch.cat([maxima, scores[:, whole:].amax(-1, keepdim=True)], dim=1)  # (B, blocks + 1)
    starts = maxima.numpy().argmax(-1) * _BLOCK  # (B,)
    values = scores.numpy()
    found = [start + values[row, start : start + _BLOCK].argmax() for row, start in enumerate(starts.tolist())]
    return torch.tensor(found, dtype=torch.long)


def sample(scores: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """scores (B, vocab), already warped -> token ids (B,), drawn with `generator`."""
    return torch.multinomial(probabilities(scores), num_samples=1, generator=generator).squeeze(1)


def probabilities(scores: torch.Tensor) -> torch.Tensor:
    """scores (B, vocab), already warped -> the sampling distribution (B, vocab), refused if not finite."""
    probs = torch.softmax(scores, dim=-1)  # (B, vocab)
    if not bool(torch.isfinite(probs).all()):  # multinomial would raise a bare RuntimeError
        raise InvalidInputError(
            "the sampling distribution holds NaN or inf: the scores overflowed float32 (a temperature as small "
            "as 1e-300 does that) or a logits processor produced NaN; use a temperature >= 1e-5, or greedy "
            "decoding (do_sample=False)"
        )
    return probs


def next_token(scores: torch.Tensor, do_sample: bool, generator: torch.Generator | None) -> torch.Tensor:
    return sample(scores, generator) if do_sample else greedy(scores)


def checked_sampler(sampler) -> str:
    """A Request.sampler value, or InvalidInputError naming the choices."""
    if sampler not in SAMPLERS:
        raise InvalidInputError(f"sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r:.40}")
    return sampler


def at_top_k(processors: LogitsProcessorList) -> tuple[LogitsProcessorList, int, LogitsProcessorList] | None:
    """processors as (those before HF's top-k warper, its k, it and those after it) when only warpers that
    rank the survivors by value, and filter to -inf, follow it; None when it is absent, or something else
    follows it."""
    for i, p in enumerate(processors):
        if type(p) is TopKLogitsWarper:
            # a finite filter value would give the tokens top-k removed a probability the survivors never see
            if not all(type(w) in _RANKING and _filters_to_minus_inf(w) for w in processors[i:]):
                return None
            return LogitsProcessorList(processors[:i]), p.top_k, LogitsProcessorList(processors[i:])
    return None


def _filters_to_minus_inf(warper) -> bool:
    return getattr(warper, "filter_value", float("-inf")) == float("-inf")  # temperature filters nothing


def ranks_like_its_input(processors: LogitsProcessorList) -> bool:
    """Whether `processors` (those before top-k) only rescale the scores by a positive constant
    (temperature): they then keep the order and ties, so they may run over the survivors of the raw logits
    instead of the whole vocabulary, and one top-k may serve several requests (shared_top_k)."""
    rescales = (type(p) is TemperatureLogitsWarper and finite_real(p.temperature) for p in processors)
    return all(rescales) and all(p.temperature > 0 for p in processors)


def blocked(k: int, vocab: int) -> bool:
    """Whether the top k + 1 of a vocabulary is taken among blocks (top_k_and_next): only where the k + 1
    blocks are a small part of it, else the blocks would cost more than ATen's topk over the whole."""
    return (k + 1) * _BLOCK * 4 <= vocab


def top_k_and_next(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """scores (B, vocab) -> each row's k + 1 highest (values, indices), each (B, min(k + 1, vocab)),
    highest first. The (k + 1)-th tells a tie at the k-th score without a pass over the whole vocabulary."""
    n, vocab = min(k + 1, scores.shape[-1]), scores.shape[-1]
    if not blocked(k, vocab):
        return torch.topk(scores, n)
    candidates = _candidates(scores, n)  # (B, n * _BLOCK + tail)
    values, at = torch.topk(scores.gather(1, candidates), n)  # (B, n) each
    return values, candidates.gather(1, at)


def _candidates(scores: torch.Tensor, n: int) -> torch.Tensor:
    """scores (B, vocab) -> the indices (B, n * _BLOCK + tail) of the n blocks with the highest maxima, and
    of the entries after the last whole block. They hold every row's n highest values: a value among the
    n highest outside them would lie in a block whose maximum, at least that value, is exceeded or equalled
    by the maxima of n chosen blocks, n distinct entries at least as high. ATen's topk over 262k entries
    a row took 0.46 ms (1.6 for 8 rows); this one reduction pass and two small topk 0.07 (0.25)."""
    rows, vocab = scores.shape
    whole = vocab // _BLOCK
    maxima = scores[:, : whole * _BLOCK].reshape(rows, whole, _BLOCK).amax(-1)  # (B, blocks)
    blocks = torch.topk(maxima, n).indices  # (B, n)
    offsets = torch.arange(_BLOCK, device=scores.device)
    inside = (blocks[:, :, None] * _BLOCK + offsets).reshape(rows, -1)  # (B, n * _BLOCK)
    tail = torch.arange(whole * _BLOCK, vocab, device=scores.device).expand(rows, -1)  # (B, vocab % _BLOCK)
    return torch.cat([inside, tail], dim=1)


def shared_top_k(logits: torch.Tensor, requests: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """logits (width, vocab) and (rows, k) of each request that takes the raw logits' top k + 1 -> one
    top_k_and_next over every row at the largest k among those whose top-k is blocked (any k at a small
    vocabulary), (width, kmax + 1) each, of which each such request reads its rows' first k + 1; a larger
    k takes its own call, as one at k 20,000 would make every row's a topk over the whole vocabulary (3 ->
    52 ms for 8 rows of 262k).
    None unless the rows that share are at least two and half the step: the step's other rows would
    cost more than the calls saved."""
    vocab = logits.shape[-1]
    ks = [(b, k) for b, k in requests if blocked(k, vocab) or vocab <= _SMALL_VOCABULARY]
    rows = sum(b for b, _ in ks)
    if rows < 2 or 2 * rows < logits.shape[0]:
        return None
    return top_k_and_next(logits, max(k for _, k in ks))  # one call: ATen splits its rows over threads


def survivors_distribution(
    values: torch.Tensor, indices: torch.Tensor, k: int, rest: LogitsProcessorList, history: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each row's highest scores, processed up to the top-k warper, highest first: (values, indices)
    (B, min(k + 1, vocab) or more columns) -> (token ids (B, k'), their probabilities (B, k')), k' =
    min(k, vocab): `rest` (the top-k warper and the ranking warpers after it) over the k highest, in
    vocabulary order; None when a tie at a row's k-th score would make HF keep more than k tokens."""
    if values.shape[-1] > k:  # fewer columns than k + 1: k covers the whole vocabulary, no tie possible
        kth, after = values[:, k - 1], values[:, k]  # (B,) each; -inf: fewer than k tokens are possible
        if bool((torch.isfinite(kth) & (after == kth)).any()):
            return None
    # Vocabulary order, as HF's warpers meet the survivors over the whole vocabulary: top-p's cut inside
    # a group of equal scores then keeps the tokens HF keeps, and a seeded draw does not depend on the
    # order a top-k call returned ties in (its own call, or the step's shared one). -inf survivors (fewer
    # than k possible tokens: a grammar's mask) go last, whichever -inf tokens a top-k returned: where
    # they sat among the others, they moved tied finite scores and so which ones top-p's sort kept
    values, indices = values[:, :k], indices[:, :k]  # (B, k') each
    _, order = (indices + (torch.isneginf(values).long() << 40)).sort(dim=-1)
    indices, values = indices.gather(1, order), values.gather(1, order)
    for warper in rest:  # HF's own warpers, called as LogitsProcessorList would, without its
        values = warper(history, values)  # inspect.signature of each one at each call (0.1 ms a row)
    return indices, probabilities(values)


def top_k_distribution(
    scores: torch.Tensor, k: int, rest: LogitsProcessorList, history: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """scores (B, vocab), processed up to the top-k warper -> survivors_distribution of its top k + 1."""
    return survivors_distribution(*top_k_and_next(scores, k), k, rest, history)


def draw(survivors: tuple[torch.Tensor, torch.Tensor], generator) -> torch.Tensor:
    """(token ids (B, k), their probabilities (B, k)) -> one token id per row (B,), drawn with `generator`."""
    indices, probs = survivors
    choice = torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)
    return indices.gather(1, choice).squeeze(1)
