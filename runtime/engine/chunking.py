"""How many prompt tokens a prefill chunk takes while other requests decode: a token count, or a time.

Owns the chunk size the scheduler (runtime.engine.scheduler) hands out. A fixed count (`prefill_chunk`)
stalls the running streams by however long that many tokens take, which depends on the machine, the
model, the context and the load; with a time budget (`prefill_budget`, in decode steps) the size follows
what the engine measures instead: after each piece, the next chunk is this piece's tokens scaled by the
budget over what it took, within [min(MIN_CHUNK, prefill_chunk), prefill_chunk] (prefill_chunk while no
decode step is measured, MIN_CHUNK while no piece is). A chunk costs about a + b * tokens (a: one
pass over every layer's weights and ops; b: each token's arithmetic), so scaling n by r = target / (a + b n)
lands short of the target when growing (r > 1) and still over it when shrinking (r < 1): a chunk over
budget is scaled by r squared instead, which lands at or under it, and the sizes then grow onto the
target from below, so a stall over the budget is one chunk long (one chunk goes in an iteration while
others decode: runtime.engine.scheduler). When a alone takes more than the
budget, chunks shrink to MIN_CHUNK. A stream then waits about (1 + budget) steps for its next token while
a long prompt goes in. A bundle's chunk graph takes C tokens a call (runtime.engine.runner), so sizes
are then whole multiples of C (`quantum`), at least one: a call's padding costs as much as its tokens.
"""

from __future__ import annotations

# The smallest chunk a time budget gives: an eager prefill pass costs about as much for one token as for
# eight (Gemma 3 270M int8: 18 ms for 1, 26 ms for 8, 45 ms for 32 tokens on the Intel Xeon, 2 threads),
# so smaller chunks would stretch a long prompt's first token without shortening the stall.
MIN_CHUNK = 8


class ChunkSizer:
    """Not thread-safe: the engine calls it under its own lock (`size`) and from its loop (`timed`)."""

    def __init__(
        self, limit: int | None, budget: float | None, last: tuple[int, float] | None = None, quantum: int = 1
    ):
        """`limit`: the largest chunk, and every chunk's size without a budget (None: whole prompts);
        `budget`: the decode steps' time a chunk may take (None: fixed chunks); `last`: (tokens, seconds)
        of the latest prompt piece prefilled, if one was measured; `quantum`: budgeted sizes are whole
        multiples of it (a chunk graph's tokens; 1: any size)."""
        self.limit, self.budget = limit, budget
        self.last, self.quantum = last, quantum

    def size(self, step_seconds: float | None) -> int | None:
        """Tokens for the next chunk, given what a decode step of the running requests takes lately."""
        if self.limit is None or self.budget is None or step_seconds is None:
            return self.limit
        least = min(self.quantum if self.quantum > 1 else MIN_CHUNK, self.limit)
        if self.last is None:  # nothing prefilled yet: start small, and grow onto the budget from below
            return least
        tokens, seconds = self.last
        ratio = self.budget * step_seconds / max(seconds, 1e-9)
        scaled = min(self.limit, round(tokens * (ratio if ratio >= 1 else ratio * ratio)))
        return max(least, scaled - scaled % self.quantum)

    def timed(self, tokens: int, seconds: float) -> None:
        """A text piece of `tokens` prompt tokens took `seconds` to prefill."""
        if tokens > 0:
            self.last = (tokens, seconds)
