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

    def __init__(self, request, want_logits: bool, wake, reservation=None, reuse: int = 0):
        self.request = request
        self.want_logits = want_logits
        self.reservation = reservation  # a session's row (runtime.engine.Reservation), or None: any free rows
        self.reuse = reuse  # with a reservation: prompt tokens its row already holds
        self.submitted = time.monotonic()
        self.times: list[float] = []  # time.monotonic() of each step's tokens, as the engine produced them
        self.scores: list[torch.Tensor] = []  # processed scores (b, vocab) per step, when the request keeps them
        self._wake = wake  # tells the engine to look at this handle now
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._cancelled = threading.Event()
        self._finished = threading.Event()
        self.error: BaseException | None = None

    # ---- the engine's side ----
    def put(self, token: torch.Tensor, logits: torch.Tensor | None, scores: torch.Tensor | None = None) -> None:
        self.times.append(time.monotonic())
        if scores is not None:
            self.scores.append(scores)
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

    def wait(self, timeout: float | None = None) -> bool:
        """Until the engine has released the request (a cancelled one at its next step); True once it has."""
        return self._finished.wait(timeout)

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


def streamed(handle: Handle, streamer=None):
    """Iterate `handle`, feeding `streamer` as `generate` does: the prompt, each step's tokens, then
    `end()`, also when the generation fails or is interrupted, so a consumer iterating the streamer
    (TextIteratorStreamer in another thread) is never left waiting. A token reaches the caller before
    the streamer shows it: interrupted (Ctrl-C), the caller has at least what was shown."""
    try:
        if streamer is not None:
            streamer.put(handle.request.input_ids.cpu())
        for token, logits in handle:
            yield token, logits
            if streamer is not None:
                streamer.put(token.cpu())
    finally:
        if streamer is not None:
            streamer.end()


def collect(handle: Handle, streamer=None):
    """A whole generation as `generate` returns it: (b, S + new) ids, or with `return_dict_in_generate`
    transformers' own GenerateDecoderOnlyOutput."""
    from transformers.generation import GenerateDecoderOnlyOutput

    config, tokens, logits = handle.request.config, [], []
    for token, step_logits in streamed(handle, streamer):
        tokens.append(token)
        logits.append(step_logits)
    sequences = torch.cat([handle.request.input_ids, torch.stack(tokens, dim=1)], dim=1)  # (b, S + new)
    if not config.return_dict_in_generate:
        return sequences
    return GenerateDecoderOnlyOutput(
        sequences=sequences,
        scores=tuple(handle.scores) if config.output_scores else None,
        logits=tuple(logits) if config.output_logits else None,
    )
