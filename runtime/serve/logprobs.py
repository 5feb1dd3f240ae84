"""Log-probabilities of the generated tokens and their top alternatives, shaped as OpenAI's two APIs do.

Owns: scoring one step's raw logits (`scored`) and the `logprobs` objects of chat completions (a list of
`{"token", "logprob", "bytes", "top_logprobs"}`) and of the legacy completions (parallel lists:
`tokens`, `token_logprobs`, `top_logprobs` as {token: logprob}, `text_offset`). The numbers are
log_softmax of the raw logits, those `generate(output_logits=True)` returns, before any temperature or
penalty (vLLM's default too).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_TOP = 20  # top_logprobs at most, as OpenAI and vLLM take


@dataclass(frozen=True)
class Scored:
    """One generated token: its id and log-probability, and the `top` most likely ids with theirs."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def scored(token_id: int, logits: torch.Tensor, top: int) -> Scored:
    """logits (vocab,) raw -> the chosen token's log-probability and the `top` best alternatives."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # (vocab,)
    values, ids = logprobs.topk(top) if top else (logprobs[:0], logprobs[:0].long())
    return Scored(token_id, logprobs[token_id].item(), tuple(zip(ids.tolist(), values.tolist(), strict=True)))


def _entry(tokenizer, token_id: int, logprob: float) -> dict:
    text = tokenizer.decode([token_id])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def chat_logprobs(tokenizer, tokens: list[Scored]) -> dict:
    """A chat choice's (or chunk's) `logprobs`: {"content": [...]}, one entry per token."""
    content = [
        _entry(tokenizer, s.token_id, s.logprob) | {"top_logprobs": [_entry(tokenizer, i, lp) for i, lp in s.top]}
        for s in tokens
    ]
    return {"content": content}


def completion_logprobs(tokenizer, tokens: list[Scored], offset: int) -> dict:
    """A completion choice's `logprobs`, its text starting `offset` characters into the reply."""
    texts = [tokenizer.decode([s.token_id]) for s in tokens]
    starts = [offset + sum(map(len, texts[:i])) for i in range(len(texts))]
    return {
        "tokens": texts,
        "token_logprobs": [s.logprob for s in tokens],
        "top_logprobs": [{tokenizer.decode([i]): lp for i, lp in s.top} for s in tokens],
        "text_offset": starts,
    }
