"""Continuous batching: one loaded bundle serving many independent requests at once.

Owns: the bundle's B cache rows, the queue of requests waiting for rows, and the loop that runs them.
Between two decode steps the loop drops cancelled requests, admits waiting ones into free rows (their
eager prefill writes those rows only), and then advances every running request by one token with one
call of the compiled step. Each request keeps its own options, generator and stopping rules
(runtime.sequence); a request that fails (a raising prefill, say) fails alone.

Why it pays: a decode step is bound by reading the weights, and one step over 8 rows reads them once.

The loop runs in a thread of its own, started when a request arrives and ended when none is left, so
an idle engine holds no thread and a dropped Runtime is freed. Requests wait in arrival order; a
request that found no free rows within `busy_timeout` seconds fails with RuntimeBusyError.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections import deque

import torch

from runtime.cache import allocate
from runtime.errors import EngineClosedError, QueueFullError, RuntimeBusyError
from runtime.handle import Handle
from runtime.prefill import prefill_more, prefill_prompt, prefill_states
from runtime.rows import Rows, prompt_positions
from runtime.sequence import Sequence


class Reservation:
    """A cache row held by a session (runtime.session) between its turns: the KV of `ids` stays in it.
    Between turns the row is parked at the index after `ids`, the slot the next turn's prefill writes
    first, so the steps of other requests that run over it change nothing it keeps."""

    decoding = False  # an owner of rows that the step does not advance

    def __init__(self, rows: slice):
        self.rows = rows
        self.ids: torch.Tensor | None = None  # (1, cached) the tokens whose keys and values the row holds


class Engine:
    def __init__(self, bundle, busy_timeout: float = 300.0, prefill_chunk: int | None = None):
        """`bundle`: its model (eager prefill), decode (compiled step), layout and manifest.
        `prefill_chunk`: prefill text prompts longer than this many tokens a chunk per step, so that a
        long prompt stalls the running requests by one chunk at a time (None: whole prompts)."""
        m = bundle.manifest
        self.bundle = bundle
        self.busy_timeout = busy_timeout
        self.prefill_chunk = prefill_chunk
        self.kv = allocate(bundle.layout, m.batch_size, getattr(torch, m.dtype), m.device)  # [k0, v0, ...] (B, ...)
        self.rows = Rows(m.batch_size, m.max_cache_len, m.device)
        self.tokens = torch.zeros(m.batch_size, 1, dtype=torch.long, device=m.device)  # (B, 1) next step input
        self._owner: list[Sequence | Reservation | None] = [None] * m.batch_size  # who holds each row
        self._waiting: deque[Handle] = deque()
        self._running: dict[Handle, Sequence] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.steps = 0  # compiled steps run, and the most requests one of them served
        self.peak_running = 0
        self._closed = False
        _ENGINES.add(self)

    # ---- callers' side (any thread) ----
    def submit(
        self, request, want_logits: bool = False, max_waiting: int | None = None, reservation=None, reuse: int = 0
    ) -> Handle:
        """Queue a validated request (runtime.generate.make_request); returns its handle at once.
        With `max_waiting`, a request that would find that many already waiting is refused instead.
        With a `reservation` (one row) the request runs in that row, whose first `reuse` cached tokens
        are the prompt's first `reuse` tokens: only the rest is prefilled."""
        handle = Handle(request, want_logits, self._wake, reservation, reuse)
        with self._cond:
            if self._closed:
                raise EngineClosedError("this runtime is shutting down and admits no new requests")
            if max_waiting is not None and len(self._waiting) >= max_waiting:
                raise QueueFullError(f"{len(self._waiting)} requests are already waiting for cache rows; retry later")
            self._waiting.append(handle)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="aotpack-engine", daemon=True)
                self._thread.start()
            self._cond.notify()
        return handle

    def reserve(self) -> Reservation:
        """Hold the lowest free row for a session until `unreserve`."""
        with self._cond:
            if self._closed:
                raise EngineClosedError("this runtime is shutting down and admits no new sessions")
            rows = self._free_rows(1)
            if rows is None:
                raise RuntimeBusyError(
                    f"all {len(self._owner)} cache rows are in use (each session holds one); close a session, "
                    "or re-export with a larger --batch-size"
                )
            reservation = Reservation(rows)
            self._owner[rows] = [reservation]
            return reservation

    def unreserve(self, reservation: Reservation) -> None:
        """Give a session's row back; the next request admitted there clears it."""
        with self._cond:
            if self._owner[reservation.rows.start] is reservation:
                self._owner[reservation.rows] = [None]
            reservation.ids = None

    def stop_admitting(self) -> None:
        """New submissions raise EngineClosedError; what is queued or running carries on."""
        with self._cond:
            self._closed = True

    def close(self, grace: float = 0.0) -> None:
        """Admit nothing new; let the requests in flight finish for up to `grace` seconds, then cancel
        the rest and wait for the loop to end."""
        self.stop_admitting()
        with self._cond:
            thread = self._thread
        if thread is not None:
            thread.join(timeout=grace)
        with self._cond:
            for handle in [*self._waiting, *self._running]:
                handle.cancel()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    @property
    def load(self) -> tuple[int, int]:
        """(requests running, requests waiting)."""
        with self._cond:
            return len(self._running), len(self._waiting)

    @property
    def rows_in_use(self) -> int:
        return sum(owner is not None for owner in self._owner)

    # ---- the loop's side ----
    def _loop(self) -> None:
        torch.set_num_threads(torch.get_num_threads())  # this thread's OpenMP team, as the process set it
        with torch.inference_mode():
            while (admitted := self._schedule()) is not None:
                for handle, sequence in admitted:
                    self._admit(handle, sequence)
                self._prefill_next_chunk()
                if any(s.decoding for s in self._running.values()):
                    self._step()

    def _schedule(self) -> list[tuple[Handle, Sequence]] | None:
        """Under the lock: drop cancelled requests, admit waiting ones that fit; None when nothing is
        left to do (the thread then ends)."""
        with self._cond:
            while True:
                for handle in [h for h in self._running if h.cancelled]:
                    self._release(handle)
                admitted = self._admissions()
                if admitted or self._running:
                    return admitted
                if not self._waiting:
                    self._thread = None
                    return None
                self._cond.wait(timeout=self._next_deadline())

    def _admissions(self) -> list[tuple[Handle, Sequence]]:
        admitted = []
        while self._waiting:
            handle = self._waiting[0]
            if handle.cancelled:
                self._waiting.popleft().finish()
                continue
            reservation = handle.reservation
            rows = reservation.rows if reservation else self._free_rows(handle.request.input_ids.shape[0])
            if rows is None:  # in arrival order: a large request is not overtaken forever
                self._expire()
                break
            self._waiting.popleft()
            sequence = Sequence(handle.request, rows)
            sequence.fed = handle.reuse if reservation else 0
            self._owner[rows] = [sequence] * (rows.stop - rows.start)
            self._running[handle] = sequence
            admitted.append((handle, sequence))
        return admitted

    def _free_rows(self, count: int) -> slice | None:
        """The lowest `count` adjacent free rows (a request's rows are one contiguous block: its prefill
        runs over a view of the cache)."""
        run = 0
        for row, owner in enumerate(self._owner):
            run = run + 1 if owner is None else 0
            if run == count:
                return slice(row + 1 - count, row + 1)
        return None

    def _expire(self) -> None:
        now = time.monotonic()
        for handle in [h for h in self._waiting if now - h.submitted >= self.busy_timeout]:
            self._waiting.remove(handle)
            handle.finish(
                RuntimeBusyError(
                    f"no free cache rows for {self.busy_timeout:g} s: all {len(self._owner)} of this bundle's rows "
                    "are generating; retry, raise busy_timeout, or re-export with a larger --batch-size"
                )
            )

    def _next_deadline(self) -> float:
        oldest = min(h.submitted for h in self._waiting)
        return max(0.0, oldest + self.busy_timeout - time.monotonic())

    def _release(self, handle: Handle, error: BaseException | None = None) -> None:
        """Free a request's rows (or hand a session's row back to it) and end its handle; the caller
        holds the lock."""
        sequence = self._running.pop(handle)
        rows, reservation = sequence.rows, handle.reservation
        if reservation is None:
            self._owner[rows] = [None] * (rows.stop - rows.start)
            self._clear(rows)
        else:
            self._keep(reservation, sequence, error)
        handle.finish(error)

    def _keep(self, reservation: Reservation, sequence: Sequence, error) -> None:
        """A session's turn ended: its row keeps the tokens whose keys and values it holds (all but the
        last chosen token, which was never fed), parked where the next turn writes first. After a
        failure nothing in the row is trusted."""
        self._owner[reservation.rows] = [reservation]
        if error is not None:
            cached = 0
        elif sequence.decoding:
            cached = int(self.rows.index[reservation.rows.start]) + 1
        else:  # cancelled while its prompt was still being prefilled
            cached = sequence.fed
        cached = min(cached, self.rows.pad_mask.shape[1] - 1)  # the parked slot must exist; it is lost
        reservation.ids = sequence.history[:, :cached] if cached else None
        if cached:
            self.rows.park(reservation.rows, cached)
        else:
            self._clear(reservation.rows)

    def _clear(self, rows: slice) -> None:
        """Rows carry nothing from one request to the next: a NaN left in a slot poisons attention even
        where masked (0 * NaN), so the cache rows are zeroed, and an idle row steps harmlessly."""
        for t in self.kv:
            t[rows].zero_()
        self.rows.idle(rows)
        self.tokens[rows] = 0

    def _admit(self, handle: Handle, sequence: Sequence) -> None:
        """Prefill a request into its rows; its last prompt token joins the next step (or, for a prompt
        ending in an image, the first token is chosen now). A long text prompt gets its first chunk."""
        r, rows, b = sequence.request, sequence.rows, self.bundle
        try:
            if sequence.fed:  # a session's row already holds the prompt's first `fed` tokens
                self._continue(sequence)
                return
            self._clear(rows)
            if self._chunked(r):
                self._feed_chunk(sequence)
                return
            kv = [t[rows] for t in self.kv]  # views of the request's rows only
            scores = prefill_prompt(b.model, kv, b.layout, r.input_ids, r.attention_mask, **r.model_inputs)
            seq = r.input_ids.shape[1]
            self._decode_from(sequence, seq if scores is not None else seq - 1)
            if scores is not None:
                self._emit(handle, sequence, scores)
        except Exception as e:  # this request fails alone; its rows are cleared for the next
            with self._cond:
                self._release(handle, e)

    def _continue(self, sequence: Sequence) -> None:
        """Prefill only the prompt's tokens past those already in the row (text: the caller made sure
        the new part holds no image), in chunks when chunking is on."""
        if sequence.fed >= sequence.request.input_ids.shape[1] - 1:
            self._decode_from(sequence, sequence.request.input_ids.shape[1] - 1)
        else:
            self._feed_chunk(sequence)

    def _chunked(self, request) -> bool:
        """Chunks continue the cache through aotpack's own masks, which know text only: a prompt with
        images is prefilled whole."""
        chunk = self.prefill_chunk
        return chunk is not None and not request.model_inputs and request.input_ids.shape[1] - 1 > chunk

    def _decode_from(self, sequence: Sequence, fed: int) -> None:
        """The prompt's first `fed` tokens are in the cache: the rows join the decode steps."""
        r = sequence.request
        self.rows.place(sequence.rows, r.attention_mask, fed)
        if fed < r.input_ids.shape[1]:
            self.tokens[sequence.rows] = r.input_ids[:, -1:]
        sequence.fed, sequence.decoding = fed, True

    def _prefill_next_chunk(self) -> None:
        """One chunk of the oldest request still prefilling, between two decode steps."""
        pending = next(((h, s) for h, s in self._running.items() if not s.decoding), None)
        if pending is None:
            return
        handle, sequence = pending
        try:
            self._feed_chunk(sequence)
        except Exception as e:
            with self._cond:
                self._release(handle, e)

    def _feed_chunk(self, sequence: Sequence) -> None:
        """Prefill the request's next chunk, from token `fed` on: the first from an empty cache, the
        others continuing it. After the last (all but the prompt's last token) the rows decode."""
        r, b, start = sequence.request, self.bundle, sequence.fed
        chunk = self.prefill_chunk or r.input_ids.shape[1]  # a session's continuation may be unchunked
        end = min(start + chunk, r.input_ids.shape[1] - 1)  # the last token is the step's
        kv = [t[sequence.rows] for t in self.kv]  # views of the request's rows only
        ids, mask = r.input_ids[:, start:end], r.attention_mask[:, :end]
        if start == 0:
            prefill_states(b.model, kv, b.layout, ids, mask, prompt_positions(mask))
        else:
            prefill_more(b.model, kv, b.layout, ids, mask, start)
        if end == r.input_ids.shape[1] - 1:
            self._decode_from(sequence, end)
        else:
            sequence.fed = end
            self.rows.park(sequence.rows, end)

    def _step(self) -> None:
        """One compiled call advances every running request by one token."""
        with self._cond:
            running = [(h, s) for h, s in self._running.items() if s.decoding]
        active = torch.tensor([o is not None and o.decoding for o in self._owner], device=self.tokens.device)  # (B,)
        count = max(s.rows.stop for _, s in running)  # rows past the last busy one are not computed
        self.rows.advance(active)
        self.steps += 1
        self.peak_running = max(self.peak_running, len(running))
        try:
            logits = self.bundle.decode(
                self.tokens[:count], *self.rows.inputs(count), [t[:count] for t in self.kv]
            ).float()  # (count, vocab)
        except Exception as e:
            with self._cond:
                for handle, _ in running:
                    self._release(handle, e)
            return
        for handle, sequence in running:
            try:
                self._emit(handle, sequence, logits[sequence.rows])
            except Exception as e:
                with self._cond:
                    self._release(handle, e)

    def _emit(self, handle: Handle, sequence: Sequence, scores: torch.Tensor) -> None:
        token = sequence.choose(scores)  # (b,)
        handle.put(token, scores, sequence.scores[-1] if sequence.scores else None)
        if sequence.done:
            with self._cond:
                self._release(handle)
        else:
            self.tokens[sequence.rows] = token[:, None]


_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """At interpreter exit, stop the loops between two steps: a daemon thread frozen inside a native
    call while the interpreter finalizes aborts the process ("terminate called")."""
    for engine in list(_ENGINES):
        engine.close()
