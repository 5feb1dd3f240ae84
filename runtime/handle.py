"""A submitted request as its caller sees it: a stream of tokens that can be cancelled.

Owns: handing tokens from the engine's thread to the caller's, in order, with the request's failure
(if any) raised in the caller's thread, and cancellation. Closing the iterator early (a `break`, a
dropped generator, Ctrl-C) cancels the request, so an abandoned request frees its cache rows.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import torch

_END = object()


class Handle:
    """Iterate for (token ids (b,), raw logits (b, vocab) fp32 or None) per step."""

    def __init__(self, request, want_logits: bool, wake):
        self.request = request
        self.want_logits = want_logits
        self.submitted = time.monotonic()
        self.times: list[float] = []  # time.monotonic() of each step's tokens, as the engine produced them
        self._wake = wake  # tells the engine to look at this handle now
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._cancelled = threading.Event()
        self._finished = threading.Event()
        self.error: BaseException | None = None

    # ---- the engine's side ----
    def put(self, token: torch.Tensor, logits: torch.Tensor | None) -> None:
        self.times.append(time.monotonic())
        self._queue.put((token, logits if self.want_logits else None))

    def finish(self, error: BaseException | None = None) -> None:
        if not self._finished.is_set():
            self.error = error
            self._finished.set()
            self._queue.put(_END)

    # ---- the caller's side ----
    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def cancel(self) -> None:
        """Stop generating; the request's rows are freed before the engine's next step."""
        if not self.done:
            self._cancelled.set()
            self._wake()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        try:
            while (item := self._get()) is not _END:
                yield item
        finally:
            self.cancel()  # a no-op once finished; otherwise the caller left early
        if self.error is not None:
            raise self.error

    def _get(self):
        while True:  # a timeout keeps the wait interruptible by Ctrl-C on every platform
            try:
                return self._queue.get(timeout=0.25)
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
