"""A submitted request as its caller sees it: a stream of tokens that can be cancelled, and its outcome.

Owns the caller's view of one request (runtime.engine.request.RequestState): handing tokens from the
engine's thread to the caller's, in order, with the request's failure (if any) raised in the caller's
thread, cancellation, and, once it has ended, why each of its sequences ended. Closing the iterator
early (a `break`, a dropped generator, Ctrl-C) cancels the request, so an abandoned request frees its
cache rows.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Callable, Iterator

import torch

from runtime.engine.request import _END, Request, RequestState
from runtime.engine.status import FinishReason


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
    """`callback` on `loop` from another thread; nothing once the loop has closed (its reader is gone)."""
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:
        pass


class Handle:
    """Iterate for (token ids (b,), raw logits (b, vocab) fp32 or None) per step."""

    def __init__(self, state: RequestState, cancel: Callable[[RequestState], None]):
        self._state, self._cancel = state, cancel

    @property
    def request(self) -> Request:
        return self._state.request

    @property
    def submitted(self) -> float:
        return self._state.submitted

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens its rows already held when it was admitted (a session's row, or the prefix
        cache's): not prefilled."""
        return self._state.reused

    @property
    def times(self) -> list[float]:
        """time.monotonic() of each step's tokens, as the engine produced them."""
        return self._state.times

    @property
    def scores(self) -> list[torch.Tensor]:
        """Processed scores (b, vocab) per step, when the request keeps them (output_scores)."""
        return self._state.scores

    @property
    def error(self) -> BaseException | None:
        return self._state.error

    @property
    def finish_reasons(self) -> tuple[FinishReason, ...] | None:
        """Why each sequence ended, once the request has (None before)."""
        return tuple(self._state.finish_reasons) if self.done else None

    @property
    def cancelled(self) -> bool:
        return self._state.cancel_requested

    @property
    def done(self) -> bool:
        return self._state.finished.is_set()

    def cancel(self) -> None:
        """Stop generating; the request's rows are freed before the engine's next step."""
        if not self.done:
            self._cancel(self._state)

    def wait(self, timeout: float | None = None) -> bool:
        """Until the engine has released the request (a cancelled one at its next step); True once it has."""
        return self._state.finished.wait(timeout)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        try:
            while (item := self._get()) is not _END:
                yield item
        finally:
            self.cancel()  # a no-op once finished; otherwise the caller left early
        if self.error is not None:
            raise self.error

    async def items(self) -> AsyncIterator[tuple[torch.Tensor, torch.Tensor | None]]:
        """The same stream for a caller on an asyncio loop (the server): the engine's thread wakes the
        loop after each put, and the loop takes what has come. A thread blocked per request instead
        (starlette's iterate_in_threadpool) hops threads three times a token; on 2 cores each hop can
        preempt one of the step's two OpenMP threads, and the other then waits at its barriers."""
        loop, ready = asyncio.get_running_loop(), asyncio.Event()
        self._state.wake = lambda: _call_soon(loop, ready.set)
        try:
            while True:
                try:
                    item = self._state.stream.get_nowait()
                except queue.Empty:
                    await ready.wait()
                    ready.clear()
                    continue
                if item is _END:
                    break
                yield item
        finally:
            self._state.wake = None
            self.cancel()  # a no-op once finished; otherwise the caller left early
        if self.error is not None:
            raise self.error

    def _get(self):
        while True:  # a timeout keeps the wait interruptible by Ctrl-C on every platform
            try:
                return self._state.stream.get(timeout=0.25)
            except queue.Empty:
                continue

    def tokens(self) -> Iterator[torch.Tensor]:
        """Token ids (b,) per step."""
        for token, _ in self:
            yield token

    def result(self) -> torch.Tensor:
        """Wait for the whole generation: (b, S + new) ids, prompt first, as `generate` returns."""
        new = list(self.tokens())
        return torch.cat([self.request.input_ids, torch.stack(new, dim=1)], dim=1)
