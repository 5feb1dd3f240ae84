"""Continuous batching: one loaded bundle serving many independent requests at once.

Owns the loop, and the thread it runs in: schedule (runtime.engine.scheduler decides, under the lock),
run (runtime.engine.runner prefills and steps, outside it), update (each request's next tokens, its
end). Between two decode steps the loop drops cancelled requests, admits waiting ones into free rows
(their eager prefill writes those rows only), and then advances every decoding request by one token
with one call of the decode step. Each request keeps its own options, generator and stopping rules
(runtime.engine.request); a request that fails (a raising prefill, say) fails alone.

Why it pays: a decode step is bound by reading the weights, and one step over 8 rows reads them once.

The loop's thread starts when a request arrives and ends when none is left, so an idle engine holds no
thread and a dropped Runtime is freed.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from contextlib import contextmanager

import torch

from runtime.config import LoadConfig
from runtime.engine import prefix, sampling
from runtime.engine.chunking import ChunkSizer
from runtime.engine.handle import Handle
from runtime.engine.openmp import release_team
from runtime.engine.request import Request, RequestState
from runtime.engine.runner import Runner, covering
from runtime.engine.scheduler import Lease, Plan, Scheduler
from runtime.engine.speculation import Drafter, StepCosts, draft_tokens
from runtime.engine.status import FinishReason, Status
from runtime.errors import RuntimeBusyError
from runtime.format.contract import DecodeContract

LOG = logging.getLogger("aotpack.engine")


class Engine:
    def __init__(
        self,
        model,
        decode,
        contract: DecodeContract,
        busy_timeout: float = LoadConfig.busy_timeout,
        prefill_chunk: int | None = LoadConfig.prefill_chunk,
        prefix_cache: bool = LoadConfig.prefix_cache,
        speculation: bool = LoadConfig.speculation,
        prefill_budget: float | None = LoadConfig.prefill_budget,
    ):
        """`model` prefills, `decode` (a backend's step over the same weights) decodes, `contract` sizes
        the cache. A request waits at most `busy_timeout` seconds for rows; with `prefill_chunk`, text
        prompts longer than that are prefilled a chunk per step (None: whole prompts), each chunk as many
        tokens as take about `prefill_budget` decode steps' time (runtime.engine.chunking). With
        `prefix_cache`, a finished one-row request's row keeps its tokens for later prompts that start
        the same way (runtime.engine.prefix), until a request needs the row. With `speculation` and a
        decode that verifies drafts, one-row requests draft by prompt lookup (runtime.engine.speculation)."""
        self.runner = Runner(model, decode, contract)
        self.draft_tokens = self.runner.draft_tokens if speculation else 0
        self.costs = StepCosts()
        self.drafted = self.accepted = self.verify_steps = 0  # totals, for metrics
        reuse = self._reusable if prefix_cache else None
        self.chunks = ChunkSizer(prefill_chunk, prefill_budget, quantum=self.runner.chunk_tokens or 1)
        self.scheduler = Scheduler(contract.batch_size, busy_timeout, prefill_chunk, reuse)
        self.layout, self.config = contract.layout, model.config
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.steps = 0  # decode steps run, and the most requests one of them served
        self.peak_running = 0
        _ENGINES.add(self)

    # ---- callers' side (any thread) ----
    def submit(
        self,
        request: Request,
        want_logits: bool = False,
        max_waiting: int | None = None,
        lease: Lease | None = None,
        reuse: int = 0,
        drafter=None,
    ) -> Handle:
        """Queue a validated request (runtime.generation.validate); returns its handle at once. With
        `max_waiting`, a request that would find that many already waiting is refused instead. With a
        `lease` (a session's row) the request runs in that row, whose first `reuse` cached tokens are the
        prompt's first `reuse` tokens: only the rest is prefilled. `drafter`: where a one-row request's
        drafts come from instead of prompt lookup (the export's parity gate drafts the reference's tokens)."""
        state = RequestState(request, want_logits, lease, _reusable(request, reuse) if lease is not None else 0)
        state.drafter = drafter if drafter is not None else self._drafter(request)
        release_team()  # the caller's idle OpenMP team would slow every step the engine's thread runs
        with self._cond:
            self.scheduler.add(state, max_waiting)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="aotpack-engine", daemon=True)
                self._thread.start()
            self._cond.notify()
        return Handle(state, self.cancel)

    @contextmanager
    def together(self):
        """Requests submitted inside the block are planned together: no iteration starts before it ends."""
        with self._cond:
            yield

    def cancel(self, state: RequestState) -> None:
        """Stop a request; its rows are freed before the next step."""
        with self._cond:
            if state.status is not Status.FINISHED:
                state.cancel_requested = True
                self._cond.notify()

    def lease(self) -> Lease:
        """Hold the lowest free row for a session until `unlease`."""
        with self._cond:
            return self.scheduler.lease()

    def unlease(self, lease: Lease) -> None:
        with self._cond:
            self.scheduler.unlease(lease)
            self._cond.notify()  # a request may be waiting for that row

    def clear_prefix_cache(self) -> None:
        """Forget what free rows keep: the next prompts are prefilled whole (a cold start, say)."""
        with self._cond:
            self.scheduler.kept.clear()

    def stop_admitting(self) -> None:
        """New submissions raise EngineClosedError; what is queued or running carries on."""
        with self._cond:
            self.scheduler.close()

    def close(self, grace: float = 0.0) -> None:
        """Admit nothing new; let the requests in flight finish for up to `grace` seconds, then cancel
        the rest and wait for the loop to end."""
        self.stop_admitting()
        with self._cond:
            thread = self._thread
        if thread is not None:
            thread.join(timeout=grace)
        with self._cond:
            for state in [*self.scheduler.waiting, *self.scheduler.running]:
                state.cancel_requested = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    @property
    def prefill_chunk(self) -> int | None:
        return self.chunks.limit

    @property
    def prefill_budget(self) -> float | None:
        return self.chunks.budget

    def chunk_prefills(self, chunk: int | None, budget: float | None = None) -> None:
        """From now on: whole prompts (None), or text prompts a chunk per iteration, of `chunk` tokens, or
        with a `budget`, as many as take about that many decode steps (at most `chunk`). What the last
        piece took stays measured: it is the model's and the machine's, not the option's."""
        LoadConfig(prefill_chunk=chunk, prefill_budget=budget)  # their ranges, checked where every load option is
        with self._cond:
            self.chunks = ChunkSizer(chunk, budget, self.chunks.last, self.chunks.quantum)
            self.scheduler.prefill_chunk = chunk

    @property
    def load(self) -> tuple[int, int]:
        """(requests running, requests waiting)."""
        with self._cond:
            return len(self.scheduler.running), len(self.scheduler.waiting)

    @property
    def rows_in_use(self) -> int:
        return self.scheduler.rows_in_use

    @property
    def kv(self) -> list[torch.Tensor]:
        return self.runner.kv

    # ---- the loop's side ----
    def _loop(self) -> None:
        torch.set_num_threads(torch.get_num_threads())  # this thread's OpenMP team, as the process set it
        try:
            with torch.inference_mode():
                while (plan := self._next_plan()) is not None:
                    self._carry_out(plan)
        except BaseException as e:  # a bug of the engine's own: nobody may be left waiting on a dead loop
            # Logged, not raised: each request it held gets the error, and an exception escaping a thread
            # only reaches threading.excepthook (which a test runner turns into a crashed worker).
            LOG.exception("the engine's loop failed; its requests fail with the error, the next one starts a new loop")
            self._abandon(e)

    def _abandon(self, error: BaseException) -> None:
        """Fail every request the loop held or queued, and let the next submission start a new loop."""
        with self._cond:
            states = [*self.scheduler.waiting, *self.scheduler.running]
            self.scheduler.waiting.clear()
            for state in list(self.scheduler.running):
                self.scheduler.finish(state)
            self._thread = None
        for state in states:
            state.finish(FinishReason.FAILED, error)

    def _next_plan(self) -> Plan | None:
        """Under the lock: the next iteration's plan; None when nothing is left (the thread then ends)."""
        with self._cond:
            while True:
                if self.chunks.budget is not None:
                    self.scheduler.prefill_chunk = self.chunks.size(self._step_seconds())
                plan = self.scheduler.plan(time.monotonic())
                if not plan.empty or self.scheduler.running:
                    return plan
                if self.scheduler.idle:
                    self._thread = None
                    return None
                self._cond.wait(timeout=self.scheduler.deadline(time.monotonic()))

    def _carry_out(self, plan: Plan) -> None:
        for state in plan.released:
            self._end(state, FinishReason.CANCELLED)
        for state in plan.dropped:
            state.finish(FinishReason.CANCELLED)
        for state in plan.expired:
            state.finish(FinishReason.FAILED, self._busy())
        for kind, a, b in plan.shuffles:  # in order, before the rows taken are cleared for their requests
            (self.runner.swap if kind == "trade" else self.runner.copy)(a, b)
        for state in plan.admitted:
            try:
                self._begin(state)
            except BaseException as e:  # this request fails alone (see _step)
                self._end(state, FinishReason.FAILED, e)
        for state, source in plan.moved:
            try:
                self.runner.move(state, source)
            except BaseException as e:
                self._end(state, FinishReason.FAILED, e)
        for piece in plan.prefill:
            self._prefill(piece)
        with self._cond:
            decoding, _ = self.scheduler.decoding()
        decoding = self._joining(decoding, plan.prefill)
        if decoding:
            self._step(decoding, max(s.rows.stop for s in decoding))

    def _joining(self, decoding: list[RequestState], pieces) -> list[RequestState]:
        """The requests this iteration's step advances: those decoding, less any whose prompt went in just
        now and that stand past every other one. Stepped at once, such a row widens this step's attention
        (every row attends as far as the furthest) on top of the piece that just ran: the largest stall
        the running streams saw while a long prompt went in (Gemma 3 270M int8, 8 rows, a 512-token
        prompt: its last 10 ms chunk, then a 15 ms step where the others took 10). It joins at the next
        step instead (resting meanwhile, runtime.engine.runner), one step later; alone, or within the
        others' reach, it steps at once."""
        waiting = {id(p.state) for p in pieces if p.state.status is Status.DECODING}  # joined now; may wait
        others = [s for s in decoding if id(s) not in waiting]
        if not waiting or not others:
            return decoding
        index = self.runner.positions.index
        stands = {id(s): int(index[s.rows].max()) for s in decoding}
        reach = max(stands[id(s)] for s in others) + 1  # where the furthest stepped row stands once advanced
        # A row that waits must stand past every stepped row once they advance (it then rests,
        # runtime.engine.runner._resting): stepped where it stands without advancing, the step would
        # overwrite its last prompt token's slot. Joining rows move `reach` too: nearest first.
        for state in sorted((s for s in decoding if id(s) in waiting), key=lambda s: stands[id(s)]):
            if stands[id(state)] > reach:
                break  # this one and every further one wait
            waiting.discard(id(state))
            reach = max(reach, stands[id(state)] + 1)
        return [s for s in decoding if id(s) not in waiting]

    def _begin(self, state: RequestState) -> None:
        """Rows a request takes start clean, unless they hold its session's conversation or a prefix of
        its prompt (the scheduler has set `fed` to what they hold)."""
        state.reused = state.fed
        if state.fed == 0:
            self.runner.clear(state.rows)
        if state.status is Status.DECODING:  # a session's row holds the whole prompt but its last token
            self.runner.begin_decoding(state, state.fed)  # (or the prompt is that one token)
        elif state.fed > 0:
            self.runner.hold(state.rows, state.fed)

    def _step_seconds(self) -> float | None:
        """What a step of the requests decoding now took lately: the decode graph's covering them, else
        the verify graph's (with speculation, decode steps may be rare); None: not measured yet."""
        _, width = self.scheduler.decoding()
        if not width:
            return None
        decode = self.costs.seconds.get(("decode", self._covering(self.runner.decode.batches, width)))
        if decode is not None or not self.draft_tokens:
            return decode
        return self.costs.seconds.get(("verify", self._covering(self.runner.decode.verify_batches, width)))

    def _prefill(self, piece) -> None:
        try:
            start, chunkable = time.perf_counter(), piece.state.chunkable  # images make a piece cost otherwise
            logits = self.runner.prefill(piece)
            with self._cond:
                if chunkable:
                    self.chunks.timed(piece.end - piece.start, time.perf_counter() - start)
                self.scheduler.prefilled(piece)
            if logits is not None:
                self._emit(piece.state, logits)
        except BaseException as e:  # this request fails alone; its rows are cleared for the next
            self._end(piece.state, FinishReason.FAILED, e)

    def _step(self, decoding: list[RequestState], width: int) -> None:
        """One decode call advances every decoding request by one token (a verify call, by more)."""
        self.steps += 1
        self.peak_running = max(self.peak_running, len(decoding))
        drafts = self._drafts(decoding, width)
        if drafts is not None:
            self._verify(decoding, width, drafts)
            return
        start = time.perf_counter()
        try:
            logits = self.runner.step(decoding, width)  # (width, vocab)
        except BaseException as e:  # KeyboardInterrupt and SystemExit too: on this thread no signal raises
            # them, only a request's own code (a logits processor, a stopping criterion) can
            for state in decoding:
                self._end(state, FinishReason.FAILED, e)
            return
        self.costs.timed("decode", self._covering(self.runner.decode.batches, width), start)
        greedy = sum(s.batch for s in decoding if s.takes_argmax)  # rows whose token starts as the raw argmax
        argmax = sampling.greedy(logits) if greedy > 1 and 2 * greedy >= width else None  # (width,): one call
        top = sampling.shared_top_k(logits, [(s.batch, s.raw_top_k) for s in decoding if s.raw_top_k is not None])
        for state in decoding:
            taken = argmax[state.rows] if argmax is not None and state.takes_argmax else None
            shared = top is not None and state.raw_top_k is not None and state.raw_top_k < top[0].shape[-1]
            tops = (top[0][state.rows], top[1][state.rows]) if shared else None  # (b, kmax + 1) each
            try:
                self._emit(state, logits[state.rows], taken, tops)
            except BaseException as e:
                self._end(state, FinishReason.FAILED, e)

    def _drafter(self, request: Request) -> Drafter | None:
        """Prompt lookup for a one-row request that may draft (runtime.engine.speculation.draft_tokens)."""
        config = request.config
        k = draft_tokens(config.prompt_lookup_num_tokens, self.draft_tokens, bool(config.do_sample))
        if request.batch != 1 or not k:
            return None
        return Drafter(k, config.max_matching_ngram_size or DEFAULT_NGRAM)

    def _drafts(self, decoding: list[RequestState], width: int) -> dict[int, torch.Tensor] | None:
        """Each drafting row's drafts for a verify step, when one pays for itself (StepCosts); else None."""
        batch = self.runner.verify_batch(decoding, width) if self.draft_tokens else None
        if batch is None or not any(s.drafter for s in decoding):
            return None
        drafts, expected = {}, 0.0
        for state in decoding:
            room = min(self.draft_tokens, state.request.config.max_new_tokens - state.steps - 1)
            drafted = state.drafter.propose(state.history, room) if state.drafter else None
            if drafted is not None:
                drafts[state.rows.start] = drafted
            expected += state.drafter.expected(drafted.shape[0]) if drafted is not None else state.batch
        rows = sum(s.batch for s in decoding)
        decode_batch = self._covering(self.runner.decode.batches, width)
        if drafts and self.costs.pays(decode_batch, batch, rows, expected):
            return drafts
        for state in decoding:
            if state.rows.start in drafts:
                state.drafter.declined(drafts[state.rows.start], state.history.shape[1])
        return None

    def _covering(self, batches: tuple[int, ...], width: int) -> int:
        return covering(batches, width, len(self.scheduler.owners))

    def _verify(self, decoding: list[RequestState], width: int, drafts: dict[int, torch.Tensor]) -> None:
        """One verify step: each request takes its next token and then its drafts while they are what
        it would have chosen (runtime.engine.request.RequestState.choose), as many tokens as it accepts."""
        self.verify_steps += 1
        start = time.perf_counter()
        try:
            logits = self.runner.verify(decoding, width, drafts)  # (width, k + 1, vocab)
        except BaseException as e:  # as in _step
            for state in decoding:
                self._end(state, FinishReason.FAILED, e)
            return
        self.costs.timed("verify", self._covering(self.runner.decode.verify_batches, width), start)
        for state in decoding:
            try:
                self._accept(state, logits[state.rows], drafts.get(state.rows.start))
            except BaseException as e:
                self._end(state, FinishReason.FAILED, e)

    def _accept(self, state: RequestState, logits: torch.Tensor, drafted: torch.Tensor | None) -> None:
        """logits (b, k + 1, vocab): the request's tokens from one verify step; `drafted` (d,) its drafts."""
        if drafted is None:
            self._emit(state, logits[:, 0])
            return
        accepted = 0
        for j in range(drafted.shape[0] + 1):
            guess = int(drafted[j]) if j < drafted.shape[0] else None
            token = state.choose(logits[:, j], None, guess)  # (1,)
            state.put(token, logits[:, j])
            if state.done or guess is None or int(token) != guess:
                break
            accepted += 1
        state.drafter.record(drafted.shape[0], accepted)
        self.drafted, self.accepted = self.drafted + drafted.shape[0], self.accepted + accepted
        self.runner.settle(state, accepted, drafted.shape[0])  # before _end: the row keeps what it holds
        if state.done:
            self._end(state)
        else:
            self.runner.feed(state, token)

    def _emit(
        self,
        state: RequestState,
        logits: torch.Tensor,
        argmax: torch.Tensor | None = None,
        top: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        token = state.choose(logits, argmax, top=top)  # (b,)
        state.put(token, logits)
        if state.done:
            self._end(state)
        else:
            self.runner.feed(state, token)

    def _end(self, state: RequestState, reason: FinishReason | None = None, error: BaseException | None = None):
        """Free a request's rows (or hand a session's row back to it, keeping what it holds) and end it."""
        with self._cond:
            if state in self.scheduler.running:
                self.scheduler.finish(state)
        if state.lease is not None:
            cached = self.runner.keep(state, failed=error is not None)
            state.lease.held = _held(state, cached) if cached else None
        elif state.rows is not None and state.batch == 1 and self.scheduler.reuse is not None:
            if cached := self.runner.keep(state, failed=error is not None):  # after a failure: nothing
                with self._cond:
                    self.scheduler.keep(state.rows.start, (_held(state, cached), state.images), cached)
        elif state.rows is not None:
            self.runner.release(state.rows, wipe=error is not None)  # after a failure nothing in it is trusted
        state.finish(reason, error)

    def _reusable(self, state: RequestState, kept: tuple[torch.Tensor, tuple[str, ...]]) -> int:
        """The prefix cache's rule (runtime.engine.prefix): prompt tokens of a one-row request that a
        free row keeping `kept` (what it holds (1, T), its images' digests) holds."""
        held, images = kept
        r = state.request
        return prefix.reusable(held, r.input_ids, r.attention_mask, self.layout, self.config, images == state.images)

    def _busy(self) -> RuntimeBusyError:
        s = self.scheduler
        return RuntimeBusyError(
            f"no free cache rows for {s.busy_timeout:g} s: all {len(s.owners)} of this bundle's rows are "
            "generating; retry, raise busy_timeout, or re-export with a larger --batch-size"
        )


def _held(state: RequestState, cached: int) -> torch.Tensor:
    """What a finished one-row request's row holds of its first `cached` tokens (runtime.engine.prefix)."""
    return prefix.holding(state.history[:, :cached], state.request.attention_mask)  # (1, cached)


def _reusable(request: Request, reuse: int) -> int:
    """Prompt tokens a leased row's cache may stand for: at most all but the last, which the decode step
    feeds (none when the prompt ends in an image token: such a prompt is prefilled whole)."""
    return 0 if request.ends_in_image else max(0, min(reuse, request.prompt_len - 1))


# HF's prompt lookup matches n-grams of up to 2 tokens unless `max_matching_ngram_size` says otherwise
DEFAULT_NGRAM = 2

_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """At interpreter exit, stop the loops between two steps: a daemon thread frozen inside a native
    call while the interpreter finalizes aborts the process ("terminate called")."""
    for engine in list(_ENGINES):
        engine.close()
