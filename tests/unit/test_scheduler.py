"""The scheduler with no model, no tensors and no clock: who gets which rows, in what order, which
prompt pieces each iteration prefills, and what cancellation, timeouts and sessions' leases do."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from runtime.engine.scheduler import SOLO_CHUNK, Lease, Scheduler
from runtime.engine.status import Status
from runtime.errors import EngineClosedError, QueueFullError, RuntimeBusyError


@dataclass(eq=False)
class Req:
    """What the scheduler reads of a request: as runtime.engine.request.RequestState has it."""

    batch: int = 1
    prompt: int = 10
    images: bool = False
    fed: int = 0
    submitted: float = 0.0
    lease: Lease | None = None
    status: Status = Status.WAITING
    rows: slice | None = None
    cancel_requested: bool = False

    @property
    def final(self) -> int:
        return self.prompt - 1

    @property
    def chunkable(self) -> bool:
        return self.fed > 0 or not self.images


def _run_prefill(s: Scheduler, plan) -> None:
    """What the engine does with a plan's pieces: each one goes into the cache."""
    for piece in plan.prefill:
        s.prefilled(piece)


def test_requests_take_the_lowest_adjacent_free_rows_in_arrival_order():
    s = Scheduler(rows=4, busy_timeout=300)
    a, b, c = Req(batch=1), Req(batch=2), Req(batch=1)
    for r in (a, b, c):
        s.add(r)
    plan = s.plan(now=0)
    assert plan.admitted == [a, b, c]
    assert (a.rows, b.rows, c.rows) == (slice(0, 1), slice(1, 3), slice(3, 4))
    assert all(r.status is Status.PREFILLING for r in (a, b, c)) and s.rows_in_use == 4


def test_a_large_request_is_not_overtaken_by_later_small_ones():
    s = Scheduler(rows=4, busy_timeout=300)
    running, large, small = Req(batch=3), Req(batch=2), Req(batch=1)
    s.add(running)
    s.plan(now=0)
    s.add(large)
    s.add(small)
    assert s.plan(now=1).admitted == []  # one row is free, but the large one came first
    s.finish(running)
    assert s.plan(now=2).admitted == [large, small]
    assert (large.rows, small.rows) == (slice(0, 2), slice(2, 3))


def test_a_request_that_waits_past_the_busy_timeout_expires():
    s = Scheduler(rows=1, busy_timeout=5.0)
    s.add(Req(submitted=0))
    s.plan(now=0)
    late = Req(submitted=1)
    s.add(late)
    assert s.deadline(now=2) == pytest.approx(4.0)
    assert s.plan(now=5.9).expired == []
    assert s.plan(now=6.0).expired == [late] and not s.waiting


def _decoding(s: Scheduler) -> Req:
    """A request already decoding in the scheduler's lowest free row."""
    r = Req(prompt=2)
    s.add(r)
    _run_prefill(s, s.plan(now=0))
    assert r.status is Status.DECODING
    return r


def _spans(s: Scheduler, r: Req) -> list[tuple[int, int]]:
    """The pieces `r`'s prompt goes into the cache in, iteration by iteration, until it decodes."""
    spans = []
    while r.status is not Status.DECODING:
        plan = s.plan(now=0)
        spans += [(p.start, p.end) for p in plan.prefill if p.state is r]
        _run_prefill(s, plan)
    return spans


def test_text_prompts_are_prefilled_in_chunks_and_then_decode():
    s = Scheduler(rows=2, busy_timeout=300, prefill_chunk=4)
    other = _decoding(s)
    r = Req(prompt=11)  # 10 tokens go into the cache, the 11th is the first decode step's
    s.add(r)
    assert _spans(s, r) == [(0, 4), (4, 8), (8, 10)]
    assert s.decoding() == ([other, r], 2)


def test_with_no_other_request_decoding_a_prompt_goes_in_chunks_of_solo_chunk():
    """Chunks are for the other requests' sake: alone, a prompt goes in far larger ones (faster in all)."""
    s = Scheduler(rows=2, busy_timeout=300, prefill_chunk=4)
    r = Req(prompt=SOLO_CHUNK + 11)
    s.add(r)
    assert _spans(s, r) == [(0, SOLO_CHUNK), (SOLO_CHUNK, SOLO_CHUNK + 10)]


def test_a_prompt_with_images_is_prefilled_whole_and_one_ending_in_an_image_token_includes_it():
    s = Scheduler(rows=2, busy_timeout=300, prefill_chunk=4)
    r = Req(prompt=20, images=True)
    s.add(r)
    plan = s.plan(now=0)
    assert [(p.start, p.end) for p in plan.prefill] == [(0, 19)]

    class EndsInImage(Req):
        @property
        def final(self) -> int:
            return self.prompt  # the decode graph cannot embed an image token: the prefill takes it too

    s = Scheduler(rows=1, busy_timeout=300)
    r = EndsInImage(prompt=7, images=True)
    s.add(r)
    assert [(p.start, p.end) for p in s.plan(now=0).prefill] == [(0, 7)]


def test_while_others_decode_one_prompt_goes_in_an_iteration_the_oldest_first():
    """A chunk bounds the others' stall only if it is the iteration's only one: prompts arriving
    together go in one after another, not a chunk each per iteration."""
    s = Scheduler(rows=4, busy_timeout=300, prefill_chunk=2)
    _decoding(s)
    old = Req(prompt=5)
    s.add(old)
    _run_prefill(s, s.plan(now=0))  # old: [0, 2)
    new, newer = Req(prompt=5), Req(prompt=5)
    s.add(new)
    s.add(newer)
    pieces = []
    while old.status is Status.PREFILLING or new.status is Status.PREFILLING or newer.status is Status.PREFILLING:
        plan = s.plan(now=1)
        pieces.append([(p.state, p.start, p.end) for p in plan.prefill])
        _run_prefill(s, plan)
    assert pieces == [[(old, 2, 4)], [(new, 0, 2)], [(new, 2, 4)], [(newer, 0, 2)], [(newer, 2, 4)]]


def test_with_none_decoding_each_new_request_gets_its_first_chunk_and_the_oldest_pending_one_more():
    s = Scheduler(rows=3, busy_timeout=300, prefill_chunk=2)
    old = Req(prompt=SOLO_CHUNK + 9)
    s.add(old)
    _run_prefill(s, s.plan(now=0))  # old: [0, SOLO_CHUNK)
    new = Req(prompt=9)
    s.add(new)
    plan = s.plan(now=1)
    assert [(p.state, p.start, p.end) for p in plan.prefill] == [(new, 0, 8), (old, SOLO_CHUNK, SOLO_CHUNK + 8)]


def test_cancelled_requests_are_released_or_dropped_and_their_rows_reused():
    s = Scheduler(rows=2, busy_timeout=300)
    running, waiting = Req(batch=2), Req()
    s.add(running)
    s.plan(now=0)
    s.add(waiting)
    waiting.cancel_requested = running.cancel_requested = True
    plan = s.plan(now=1)
    assert plan.released == [running] and plan.dropped == [waiting]
    assert s.rows_in_use == 0 and s.idle
    fresh = Req(batch=2)
    s.add(fresh)
    assert s.plan(now=2).admitted == [fresh] and fresh.rows == slice(0, 2)


def test_the_decode_step_covers_rows_up_to_the_last_decoding_one():
    s = Scheduler(rows=4, busy_timeout=300)
    reqs = [Req(prompt=1), Req(prompt=5), Req(prompt=1)]  # a 1-token prompt has nothing to prefill
    for r in reqs:
        s.add(r)
    plan = s.plan(now=0)
    assert [p.state for p in plan.prefill] == [reqs[1]]  # the others decode at once
    assert s.decoding() == ([reqs[0], reqs[2]], 3)  # the middle one is still prefilling, but stepped
    s.prefilled(plan.prefill[0])
    assert s.decoding() == (reqs, 3)
    s.finish(reqs[2])
    assert s.decoding() == (reqs[:2], 2)


def test_a_lease_holds_its_row_between_turns():
    s = Scheduler(rows=2, busy_timeout=300)
    lease = s.lease()
    assert lease.rows == slice(0, 1) and s.rows_in_use == 1
    other = Req()
    s.add(other)
    _run_prefill(s, s.plan(now=0))
    assert other.rows == slice(1, 2)  # the leased row is not free
    with pytest.raises(RuntimeBusyError, match="each session holds one"):
        s.lease()
    turn = Req(lease=lease, fed=6, prompt=8)  # the row holds 6 of the prompt's tokens
    s.add(turn)
    plan = s.plan(now=1)
    assert turn.rows == lease.rows and [(p.start, p.end) for p in plan.prefill] == [(6, 7)]
    s.finish(turn)
    assert s.owners[0] is lease  # back to the session, not free
    s.unlease(lease)
    assert s.owners[0] is None


def test_a_turn_whose_prompt_the_row_already_holds_decodes_at_once():
    s = Scheduler(rows=1, busy_timeout=300)
    lease = s.lease()
    turn = Req(lease=lease, fed=9, prompt=10)
    s.add(turn)
    plan = s.plan(now=0)
    assert plan.admitted == [turn] and plan.prefill == [] and turn.status is Status.DECODING


def test_a_closed_scheduler_or_a_full_queue_refuses_new_requests():
    s = Scheduler(rows=1, busy_timeout=300)
    s.add(Req())
    with pytest.raises(QueueFullError, match="1 requests are already waiting for one \\(at most 1 may wait\\)"):
        s.add(Req(), max_waiting=1)
    s.close()
    with pytest.raises(EngineClosedError):
        s.add(Req())
    with pytest.raises(EngineClosedError):
        s.lease()


def test_nothing_to_do_is_an_empty_plan():
    s = Scheduler(rows=2, busy_timeout=300)
    plan = s.plan(now=0)
    assert plan.empty and s.idle and s.deadline(now=0) is None


def test_a_bound_of_zero_waiting_admits_what_finds_free_rows_and_refuses_what_would_wait():
    """`--max-queue 0` used to refuse every request, an idle server's first one included."""
    s = Scheduler(rows=2, busy_timeout=300)
    first, second, third = Req(), Req(), Req()
    s.add(first, max_waiting=0)  # free rows, nobody waiting: it starts at once
    s.plan(now=0)
    s.add(second, max_waiting=0)  # the other free row
    s.plan(now=0)
    assert (first.rows, second.rows) == (slice(0, 1), slice(1, 2))
    with pytest.raises(QueueFullError, match="no cache row is free and 0 requests"):
        s.add(third, max_waiting=0)  # no free row: it would wait, and none may


def test_the_request_holding_the_furthest_row_moves_down_into_free_rows():
    """Requests end in any order; the one furthest out moves into the lowest free rows below it, so the
    stepped batch is as small as the load. One prefilling, or holding a session's row, stays."""
    s = Scheduler(rows=8, busy_timeout=300)
    a, b, c, d = Req(), Req(batch=2), Req(), Req()
    for r in (a, b, c, d):
        s.add(r)
    _run_prefill(s, s.plan(now=0))
    assert [r.rows.start for r in (a, b, c, d)] == [0, 1, 3, 4] and all(r.status is Status.DECODING for r in (a, b))
    s.finish(a)
    s.finish(b)
    plan = s.plan(now=0)
    assert plan.moved == [(d, slice(4, 5)), (c, slice(3, 4))]  # d into row 0, then c into row 1
    assert (d.rows, c.rows) == (slice(0, 1), slice(1, 2)) and s.owners[:2] == [d, c] and s.owners[2:] == [None] * 6
    assert s.decoding()[1] == 2 and s.plan(now=0).moved == []
    leased = s.lease()  # row 2
    e = Req(lease=leased, status=Status.WAITING)
    s.add(e)
    _run_prefill(s, s.plan(now=0))
    s.finish(d)
    assert s.plan(now=0).moved == []  # the furthest row is a session's: it stays


def _shared(state, kept) -> int:
    """A stand-in for the engine's rule: a kept record is the prompt length it shares with every request
    whose `prompt` is at least that long (the engine compares token ids)."""
    return kept if state.prompt > kept else 0


def _admitted(s: Scheduler, prompt: int, now: float = 0) -> Req:
    """A one-row request, added and planned for (admitted when rows are free)."""
    r = Req(prompt=prompt)
    s.add(r)
    s.plan(now=now)
    return r


def _finished_and_kept(s: Scheduler, r: Req, shared: int) -> None:
    s.finish(r)
    s.keep(r.rows.start, shared, shared)


def test_a_one_row_request_takes_the_free_row_keeping_most_of_its_prompt_and_prefills_the_rest():
    s = Scheduler(rows=4, busy_timeout=300, reuse=_shared)
    done = [Req(prompt=p) for p in (5, 30, 12)]
    for r in done:
        s.add(r)
    s.plan(now=0)
    for r, shared in zip(done, (5, 30, 12), strict=True):
        _finished_and_kept(s, r, shared)
    r = Req(prompt=20)  # shares 12 with row 2 and 5 with row 0; row 1's 30 is longer than its prompt
    s.add(r)
    plan = s.plan(now=1)
    assert r.rows == slice(0, 1) and r.fed == 12 and [(p.start, p.end) for p in plan.prefill] == [(12, 19)]
    # row 2's prefix came down to the lowest free row, whose own went up in its place: both still kept
    assert plan.relocated == [(slice(2, 3), slice(0, 1))] and sorted(s.kept) == [1, 2] and s.kept[2].tokens == 5


def test_a_request_sharing_nothing_takes_the_lowest_row_whose_prefix_moves_up_else_the_lru_is_evicted():
    """The lowest rows keep the stepped batch small: what a row there keeps moves to the highest row that
    keeps nothing (the runner swaps them); with none left, it moves over the least recently kept row,
    which is evicted, and the request still takes the lowest row."""
    s = Scheduler(rows=3, busy_timeout=300, reuse=_shared)
    _finished_and_kept(s, _admitted(s, 9), 50)
    fresh = Req(prompt=9)
    s.add(fresh)
    plan = s.plan(now=1)
    assert fresh.rows == slice(0, 1) and fresh.fed == 0 and plan.relocated == [(slice(0, 1), slice(2, 3))]
    assert list(s.kept) == [2] and s.kept[2].tokens == 50
    _finished_and_kept(s, _admitted(s, 9, now=2), 60)  # row 1, kept after row 2's: row 2 is the least recently used
    last = Req(prompt=9)
    s.add(last)
    plan = s.plan(now=3)
    assert last.rows == slice(1, 2) and plan.relocated == [(slice(1, 2), slice(2, 3))]
    assert list(s.kept) == [2] and s.kept[2].tokens == 60


def test_with_every_free_row_keeping_a_prefix_a_request_still_takes_the_lowest():
    """The failure CI found: rows 1-3 kept, row 0 kept most recently; a request sharing nothing took the
    least recently used row 3 and stepped the batch-4 graph. It takes row 0, whose prefix evicts row 3's."""
    s = Scheduler(rows=4, busy_timeout=300, reuse=_shared)
    for now, shared in enumerate((40, 30, 20, 10)):  # each kept in row 0, moved up into the highest spare
        _finished_and_kept(s, _admitted(s, 9, now=now), shared)
    assert {r: k.tokens for r, k in s.kept.items()} == {3: 40, 2: 30, 1: 20, 0: 10}
    fresh = Req(prompt=9)
    s.add(fresh)
    plan = s.plan(now=9)
    assert fresh.rows == slice(0, 1) and plan.relocated == [(slice(0, 1), slice(3, 4))]
    assert {r: k.tokens for r, k in s.kept.items()} == {3: 10, 2: 30, 1: 20}


def test_a_decoding_request_moves_down_over_a_kept_row_and_the_kept_prefix_goes_up():
    s = Scheduler(rows=2, busy_timeout=300, reuse=_shared)
    low, high = Req(prompt=4), Req(prompt=4)
    s.add(low)
    s.add(high)
    _run_prefill(s, s.plan(now=0))
    _finished_and_kept(s, low, 3)
    plan = s.plan(now=1)
    assert plan.moved == [(high, slice(1, 2))] and high.rows == slice(0, 1)
    assert list(s.kept) == [1] and s.kept[1].tokens == 3  # the runner swaps the rows' caches alike


def test_a_lease_or_a_scheduler_without_reuse_keeps_nothing():
    s = Scheduler(rows=2, busy_timeout=300, reuse=_shared)
    _finished_and_kept(s, _admitted(s, 4), 3)
    lease = s.lease()  # the lowest free row, which kept something: the session overwrites it
    assert lease.rows == slice(1, 2) and list(s.kept) == [0]  # a free row keeping nothing comes first
    assert s.lease().rows == slice(0, 1) and not s.kept
    plain = Scheduler(rows=1, busy_timeout=300)
    plain.keep(0, 3, 3)
    assert not plain.kept


def test_a_request_reusing_part_of_a_kept_row_copies_it_into_the_lowest_row_and_it_goes_on_keeping():
    s = Scheduler(rows=3, busy_timeout=300, reuse=lambda state, kept: min(kept, state.prompt - 1))
    _finished_and_kept(s, _admitted(s, 30), 29)
    part, whole = Req(prompt=9), Req(prompt=31)
    s.add(part)
    plan = s.plan(now=1)
    assert part.rows == slice(0, 1) and part.fed == 8 and list(s.kept) == [2]  # the kept row moved up first
    assert plan.relocated == [(slice(0, 1), slice(2, 3))] and plan.copied == [(slice(2, 3), slice(0, 1))]
    s.add(whole)  # extends all the row keeps: takes the row itself, moved down to the lowest free row
    plan = s.plan(now=2)
    assert whole.rows == slice(1, 2) and whole.fed == 29 and not plan.copied and not s.kept
    assert plan.relocated == [(slice(2, 3), slice(1, 2))]
    s.finish(part)
    s.finish(whole)
    _finished_and_kept(s, _admitted(s, 30, now=3), 29)  # row 0; rows 1 and 2 keep nothing
    s.owners[1] = s.owners[2] = Lease(slice(1, 2))  # no row left to move it to
    last = Req(prompt=9)
    s.add(last)
    plan = s.plan(now=4)
    assert last.rows == slice(0, 1) and last.fed == 8 and not s.kept and not plan.copied  # the row itself, used up
