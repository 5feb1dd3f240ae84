"""Which request runs where, and what each engine iteration does: pure Python, no model, no tensors.

Owns: the bundle's B cache rows and who holds each (a request, a session's lease, or nobody), and what
a free row's cache still holds (a finished request's tokens: the prefix cache); the queue
of requests waiting for rows, in arrival order, with its bound and the busy timeout; cancellations;
and each iteration's plan: whom to release, whom to admit into which rows, and which prompt pieces to
prefill. It reads and sets only plain fields of a request's state (`State` below, as
runtime.engine.request.RequestState has them: its batch, prompt progress, status and rows) and imports
no torch, so it is tested with no model at all
(tests/unit/test_scheduler.py), as vLLM tests its scheduler.

The policy:
- a request takes the lowest run of free adjacent rows it needs (its prefill runs over a view of the
  cache, so its rows are one block), or its session's leased row; and a decoding request holding the
  furthest row moves down into free rows below it, so the stepped batch shrinks with the load;
- prefix cache: a finished one-row request's row keeps its tokens' keys and values (`Kept`) while the
  row is free. A one-row request takes the free row whose kept tokens it can reuse most of (the engine
  says how many: `reuse`), and prefills only the rest; any other request takes the lowest free rows,
  and what they keep moves up into free rows that keep nothing (failing those, into the least recently
  kept rows, which are evicted); moving a request down never evicts one either. Rows held by running
  requests or sessions' leases are never touched;
- requests are admitted in arrival order, so a large request is not overtaken forever; one that found
  no rows within `busy_timeout` seconds expires;
- a piece is the whole prompt unless the engine chunks (`prefill_chunk`), in which case text prompts go
  `prefill_chunk` tokens at a time, and while another request decodes only one request's piece goes in
  an iteration (the oldest still prefilling), so prompts arriving together delay the others' next tokens
  by one chunk per iteration, not one each. Otherwise each admitted request gets its first piece at once,
  and the oldest pending one its next (SOLO_CHUNK at a time while no other request decodes).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from runtime.engine.status import Status
from runtime.errors import EngineClosedError, QueueFullError, RuntimeBusyError

# The chunk of a prompt prefilled while no other request decodes. Chunks are for the others' sake; alone,
# SmolLM2's 857-token prompt took 7.2 s in chunks of 32, 4.0 in chunks of 128, 2.9 in chunks of 512 and
# 2.7 whole (AMD EPYC, 2 threads). 512 stays near whole-prompt speed while a request that arrives
# meanwhile waits for one such chunk at most.
SOLO_CHUNK = 512


class State(Protocol):
    """What the scheduler reads and sets of a request (runtime.engine.request.RequestState)."""

    batch: int  # rows it needs, one per sequence
    final: int  # prompt tokens to prefill before it decodes
    chunkable: bool  # whether its next piece may be a chunk
    fed: int  # prompt tokens in the cache so far
    status: Status
    rows: slice | None
    lease: Lease | None
    cancel_requested: bool
    submitted: float  # time.monotonic() at submission


@dataclass(eq=False)
class Lease:
    """A cache row held by a session (runtime.session) between its turns. `held` is what the engine says
    the row's cache holds (the token ids, for the next turn to compare); the scheduler never reads it."""

    rows: slice
    held: object = None


@dataclass(eq=False)
class Kept:
    """What a free row's cache holds from the request that last ran there: `tokens` for the engine to
    compare prompts with (the scheduler never reads them), how many, and when it was kept."""

    tokens: object
    length: int
    used: int


@dataclass(frozen=True)
class Piece:
    """Prefill the prompt tokens [start, end) of a request into its rows."""

    state: State
    start: int
    end: int


@dataclass
class Plan:
    """One iteration's work, in the order the engine carries it out."""

    released: list[State] = field(default_factory=list)  # cancelled while holding rows: free them
    dropped: list[State] = field(default_factory=list)  # cancelled while waiting: nothing to free
    expired: list[State] = field(default_factory=list)  # waited past busy_timeout
    admitted: list[State] = field(default_factory=list)  # now hold rows; their rows start clean
    # What happens to rows before the admitted requests begin, in this order (a later entry may move a
    # row an earlier one read): ("trade", a, b): kept prefixes moved out of the low rows an admitted
    # request takes, the rows trading places, so the request steps a graph no larger than it needs and
    # the prefix stays; ("copy", kept row, request's row): its row starts as a copy of a kept row's, a
    # prefix of its prompt, which the kept row goes on keeping
    shuffles: list[tuple[str, slice, slice]] = field(default_factory=list)
    # decoding requests moved down into free rows (state, the rows it left): their cache goes with them
    moved: list[tuple[State, slice]] = field(default_factory=list)
    prefill: list[Piece] = field(default_factory=list)

    @property
    def relocated(self) -> list[tuple[slice, slice]]:
        return [(a, b) for kind, a, b in self.shuffles if kind == "trade"]

    @property
    def copied(self) -> list[tuple[slice, slice]]:
        """(kept row, request's row) of each copy."""
        return [(a, b) for kind, a, b in self.shuffles if kind == "copy"]

    @property
    def empty(self) -> bool:
        return not (self.released or self.dropped or self.expired or self.admitted or self.moved or self.prefill)


class Scheduler:
    """Not thread-safe: the engine calls it under its own lock."""

    def __init__(self, rows: int, busy_timeout: float, prefill_chunk: int | None = None, reuse=None):
        """`reuse(state, kept_tokens) -> int`: how many of a request's prompt tokens a row keeping
        `kept_tokens` already holds (None: no prefix cache)."""
        self.owners: list[State | Lease | None] = [None] * rows
        self.reuse, self.kept, self.clock = reuse, {}, 0  # kept: row -> Kept, for free rows only
        self.busy_timeout = busy_timeout
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[State] = deque()
        self.running: list[State] = []  # in admission order
        self.closed = False

    # ---- callers ----
    def add(self, state: State, max_waiting: int | None = None) -> None:
        if self.closed:
            raise EngineClosedError("this runtime is shutting down and admits no new requests")
        if max_waiting is not None and len(self.waiting) >= max_waiting and not self._starts_at_once(state):
            raise QueueFullError(
                f"no cache row is free and {len(self.waiting)} requests are already waiting for one (at most "
                f"{max_waiting} may wait); retry later"
            )
        self.waiting.append(state)

    def _starts_at_once(self, state: State) -> bool:
        """Whether a request would take free rows at the next iteration, ahead of nobody: then it never
        waits, so even a bound of 0 waiting requests admits it."""
        return not self.waiting and state.lease is None and self._free_rows(state.batch) is not None

    def lease(self) -> Lease:
        """Hold the lowest free row for a session until `unlease`."""
        if self.closed:
            raise EngineClosedError("this runtime is shutting down and admits no new sessions")
        rows = self._free_rows(1)
        if rows is None:
            raise RuntimeBusyError(
                f"all {len(self.owners)} cache rows are in use (each session holds one); close a session, "
                "or re-export with a larger --batch-size"
            )
        lease = Lease(rows)
        self._own(rows, lease)
        return lease

    def unlease(self, lease: Lease) -> None:
        """Give a session's row back; the next request admitted there clears it."""
        if self.owners[lease.rows.start] is lease:
            self._own(lease.rows, None)
        lease.held = None

    def close(self) -> None:
        """Admit nothing new; what is queued or running carries on."""
        self.closed = True

    # ---- the engine's loop ----
    def plan(self, now: float) -> Plan:
        plan = Plan()
        for state in [s for s in self.running if s.cancel_requested]:
            self.finish(state)
            plan.released.append(state)
        self._admit(plan, now)
        self._compact(plan)
        for state in plan.admitted:
            if state.fed >= state.final:  # a session's row holds the whole prompt but its last token
                state.status = Status.DECODING
        plan.prefill = [self._piece(state) for state in self._prefilling(plan)]
        return plan

    def _prefilling(self, plan: Plan) -> list[State]:
        """Whose prompt goes in this iteration: while chunks keep others' tokens coming, one request's (the
        oldest still prefilling: a chunk's size bounds the iteration's stall only if it is the only one);
        else each admitted request's, and the oldest pending one's."""
        prefilling = [s for s in self.running if s.status is Status.PREFILLING]  # in admission order
        if self.prefill_chunk is not None and any(s.status is Status.DECODING for s in self.running):
            return prefilling[:1]
        pending = next((s for s in prefilling if s not in plan.admitted), None)
        return [s for s in prefilling if s in plan.admitted] + ([pending] if pending is not None else [])

    def prefilled(self, piece: Piece) -> bool:
        """A piece is in the cache; True when its request now decodes."""
        state = piece.state
        state.fed = piece.end
        if state.fed >= state.final:
            state.status = Status.DECODING
        return state.status is Status.DECODING

    def decoding(self) -> tuple[list[State], int]:
        """The requests the next decode step advances, and how many rows it computes (rows past the last
        busy one are not)."""
        states = [s for s in self.running if s.status is Status.DECODING]
        return states, max((s.rows.stop for s in states), default=0)

    def finish(self, state: State) -> None:
        """A running request ends: its rows are free again, or go back to its session's lease."""
        self.running.remove(state)
        self._own(state.rows, state.lease)

    def keep(self, row: int, tokens: object, length: int) -> None:
        """A free row's cache holds `length` tokens (`tokens`: the engine's record of them) for later prompts."""
        if self.reuse is not None and self.owners[row] is None:
            self.clock += 1
            self.kept[row] = Kept(tokens, length, self.clock)

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def deadline(self, now: float) -> float | None:
        """Seconds until the oldest waiting request expires (None: nothing waits)."""
        if not self.waiting:
            return None
        return max(0.0, min(s.submitted for s in self.waiting) + self.busy_timeout - now)

    @property
    def rows_in_use(self) -> int:
        return sum(owner is not None for owner in self.owners)

    # ---- policy ----
    def _admit(self, plan: Plan, now: float) -> None:
        while self.waiting:
            state = self.waiting[0]
            if state.cancel_requested:
                plan.dropped.append(self.waiting.popleft())
                continue
            rows = state.lease.rows if state.lease is not None else self._rows_for(state, plan)
            if rows is None:  # in arrival order: a large request is not overtaken forever
                self._expire(plan, now)
                return
            self.waiting.popleft()
            state.rows, state.status = rows, Status.PREFILLING
            self._own(rows, state)
            self.running.append(state)
            plan.admitted.append(state)

    def _compact(self, plan: Plan) -> None:
        """Keep the requests in the lowest rows, so that the decode step computes as few as the load
        needs (the smallest graph covering them): while the request holding the furthest row is
        decoding, owns its rows (no session's lease) and free rows below it would hold it, it moves
        there. Only a request ending below another frees such rows, so moves are rare. The rows trade
        places (runtime.engine.runner.Runner.move): what the lower rows kept goes up, still kept."""
        while self.running:
            top = max(self.running, key=lambda s: s.rows.stop)
            if top.status is not Status.DECODING or top.lease is not None:
                return
            rows = self._free_rows(top.batch, spare_kept=False)
            if rows is None or rows.start >= top.rows.start:
                return
            plan.moved.append((top, top.rows))
            for row in range(rows.start, rows.stop):  # the runner swaps the rows: what they kept goes up
                self._trade(row, top.rows.start + row - rows.start)
            self._own(top.rows, None)
            self._own(rows, top)
            top.rows = rows

    def _expire(self, plan: Plan, now: float) -> None:
        for state in [s for s in self.waiting if now - s.submitted >= self.busy_timeout]:
            self.waiting.remove(state)
            plan.expired.append(state)

    def _piece(self, state: State) -> Piece:
        """The next prompt piece: whole, or a chunk; a chunk keeps other requests' tokens coming, so with
        none decoding it grows to SOLO_CHUNK (small chunks cost more in all: each runs every layer)."""
        start, end = state.fed, state.final
        if self.prefill_chunk is not None and state.chunkable:
            others = any(s is not state and s.status is Status.DECODING for s in self.running)
            end = min(start + (self.prefill_chunk if others else max(self.prefill_chunk, SOLO_CHUNK)), end)
        return Piece(state, start, end)

    def _rows_for(self, state: State, plan: Plan) -> slice | None:
        """A waiting request's rows: for one row, the free row keeping the most of its prompt (setting
        `fed` to what it reuses) when it extends all that row keeps; when it reuses only part, a copy of
        it in the lowest free row, the kept row going on keeping it; else `_clear_rows`."""
        if state.batch == 1 and self.kept:
            reuse, row = max((self.reuse(state, kept.tokens), -row) for row, kept in self.kept.items())
            if reuse > 0:
                state.fed, kept = reuse, self.kept[-row]
                if reuse >= kept.length:  # it extends all the row keeps: it takes the row, moved down
                    return self._lowered(-row, plan)
                target = self._clear_rows(1, plan)  # the lowest row; the kept one may have moved up
                source = next((r for r, k in self.kept.items() if k is kept), None)
                if source is None or source == target.start:  # no row to move it to: the target holds it
                    return target
                plan.shuffles.append(("copy", slice(source, source + 1), target))
                return target
        return self._clear_rows(state.batch, plan)

    def _lowered(self, row: int, plan: Plan) -> slice:
        """Kept `row`, traded for the lowest free row if that is lower (what that one keeps goes up)."""
        low = self._free_rows(1, spare_kept=False)
        if low.start >= row:
            return slice(row, row + 1)
        plan.shuffles.append(("trade", slice(row, row + 1), low))
        self._trade(row, low.start)
        return low

    def _clear_rows(self, count: int, plan: Plan) -> slice | None:
        """The lowest `count` free rows, what they keep moved up (most recently used first) into free rows
        keeping nothing (highest first), failing those into the least recently used kept rows, which are
        evicted; a prefix older than any such row is evicted itself. The request never goes higher than
        the lowest free rows: a kept prefix is not worth a larger graph at every step."""
        rows = self._free_rows(count, spare_kept=False)
        if rows is None:
            return None
        inside = range(rows.start, rows.stop)
        displaced = sorted((r for r in inside if r in self.kept), key=lambda r: -self.kept[r].used)
        free = [r for r in reversed(range(len(self.owners))) if self.owners[r] is None and r not in inside]
        spare = [r for r in free if r not in self.kept] + sorted((r for r in free if r in self.kept),
                                                                 key=lambda r: self.kept[r].used)  # fmt: skip
        for row, to in zip(displaced, spare, strict=False):
            if to in self.kept and self.kept[to].used > self.kept[row].used:
                break  # the rest are older than any row left to evict: they go (`_own` drops them)
            self.kept.pop(to, None)
            plan.shuffles.append(("trade", slice(row, row + 1), slice(to, to + 1)))
            self._trade(row, to)
        return rows

    def _free_rows(self, count: int, spare_kept: bool = True) -> slice | None:
        """The lowest `count` adjacent free rows; with `spare_kept`, the lowest that keep nothing, failing
        that the run whose most recently used kept row is the oldest (least recently used first out)."""
        runs = []
        for start in range(len(self.owners) - count + 1):
            rows = range(start, start + count)
            if all(self.owners[r] is None for r in rows):
                kept = [self.kept[r].used for r in rows if r in self.kept]
                if not kept or not spare_kept:
                    return slice(start, start + count)
                runs.append((max(kept), start))
        if not runs:
            return None
        start = min(runs)[1]
        return slice(start, start + count)

    def _trade(self, a: int, b: int) -> None:
        """Rows `a` and `b` trade what they keep, as the runner swaps their caches (either may keep nothing)."""
        kept = {b: self.kept.pop(a, None), a: self.kept.pop(b, None)}
        self.kept |= {row: k for row, k in kept.items() if k is not None}

    def _own(self, rows: slice, owner) -> None:
        self.owners[rows] = [owner] * (rows.stop - rows.start)
        for row in range(rows.start, rows.stop):
            if owner is not None:
                self.kept.pop(row, None)  # a row taken by a request or a lease: what it kept is overwritten
