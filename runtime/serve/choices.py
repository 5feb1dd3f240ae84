"""The text of one request's choices, as its tokens arrive: one row of the engine per sampled choice.

Owns: `StopCut`, text cut at the first stop string (excluded, as OpenAI does) while holding back only as
much text as could still start one; `ChoiceText`, one choice's text so cut, its token count, logprobs and why it ended
("stop" when it cut at a stop string or its row produced an eos, else what the engine recorded:
runtime.engine.status.FinishReason.openai); and `TextStream`, which feeds every row's tokens to its
choice. `n` greedy choices are one row decoded once (they would be identical), reported as n choices.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing

import torch

from runtime.serve.logprobs import Scored, scored
from runtime.text import TextPieces


class StopCut:
    """Text as it arrives (`add`), let out up to the first of `stops`: `stopped` once one appeared."""

    def __init__(self, stops: list[str]):
        self.stops, self.hold = stops, max((len(s) for s in stops), default=1) - 1  # what could start a stop
        self.text, self.sent, self.stopped = "", 0, False

    def add(self, piece: str, final: bool = False) -> str:
        """The text that can go out now, `piece` added; with `final`, all of it up to a stop."""
        if self.stopped:
            return ""
        self.text += piece
        found = [i for s in self.stops if (i := self.text.find(s, max(0, self.sent - self.hold))) >= 0]
        self.stopped = bool(found)
        upto = min(found) if found else len(self.text) if final else len(self.text) - self.hold
        if upto <= self.sent:
            return ""
        out, self.sent = self.text[self.sent : upto], upto
        return out


class ChoiceText:
    def __init__(self, tokenizer, stops: list[str], alternatives: int | None, eos_ids: tuple[int, ...]):
        self.pieces, self.cut, self.alternatives, self.eos_ids = (
            TextPieces(tokenizer),
            StopCut(stops),
            alternatives,
            eos_ids,
        )
        self.completion_tokens = 0
        self.ended = False  # its row produced an eos or its text a stop: the tokens after it are padding
        self.finish_reason: str | None = None
        self._scored: list[Scored] = []

    def add(self, token: int, logits) -> str:
        """The row's next token (logits (vocab,) raw, or None); returns the text that can be sent now."""
        if self.ended:
            return ""
        self.completion_tokens += 1
        if self.alternatives is not None:
            self._scored.append(scored(token, logits, self.alternatives))
        piece = self.pieces.add(token)
        if token in self.eos_ids:
            self.ended, self.finish_reason = True, "stop"
            piece += self.pieces.finish()  # what it held back (bytes of a character the eos cut short)
        return self._release(piece, final=self.ended)

    def end(self, reason: str | None) -> str:
        """The request has ended with `reason` for this row: whatever text is still held back."""
        if self.finish_reason is not None:
            return ""
        piece = self._release(self.pieces.finish(), final=True)
        self.finish_reason = self.finish_reason or reason
        return piece

    @property
    def content(self) -> str:
        """The text sent so far: every piece `add` and `end` returned, joined."""
        return self.cut.text[: self.cut.sent]

    def taken(self) -> list[Scored]:
        """The tokens scored since the last call (the text sent so far comes from them)."""
        out, self._scored = self._scored, []
        return out

    def _release(self, piece: str, final: bool) -> str:
        out = self.cut.add(piece, final)
        if self.cut.stopped:
            self.ended, self.finish_reason = True, "stop"
        return out


class TextStream:
    """Iterate for (row, text piece); afterwards every choice has its finish_reason. With `alternatives`
    (not None) every token is scored too (the handle must then carry the raw logits: want_logits)."""

    def __init__(self, tokenizer, handle, stops: list[str] | None, alternatives: int | None = None, copies: int = 1):
        self.handle, self.alternatives, self.copies, self.tokenizer = handle, alternatives, copies, tokenizer
        eos = handle.request.eos_ids
        self.rows = [ChoiceText(tokenizer, list(stops or []), alternatives, eos) for _ in range(handle.request.batch)]

    def __iter__(self) -> Iterator[tuple[int, str]]:
        for tokens, logits in self.handle:  # tokens (b,), logits (b, vocab) raw or None
            yield from self._pieces(tokens, logits)
            if self._ended():
                break
        yield from self._endings()

    async def __aiter__(self) -> AsyncIterator[tuple[int, str]]:
        """The same pieces for a caller on an asyncio loop (runtime.engine.handle.Handle.items)."""
        async with aclosing(self.handle.items()) as steps:
            async for tokens, logits in steps:
                for item in self._pieces(tokens, logits):
                    yield item
                if self._ended():
                    break
        for item in self._endings():
            yield item

    def _pieces(self, tokens: torch.Tensor, logits: torch.Tensor | None) -> list[tuple[int, str]]:
        """One step's (row, text piece) of each row that has new text: tokens (b,), logits (b, vocab)."""
        pieces = []
        for i, (row, token) in enumerate(zip(self.rows, tokens.tolist(), strict=True)):  # one copy off a device
            if piece := row.add(token, logits[i] if logits is not None else None):
                pieces.append((i, piece))
        return pieces

    def _ended(self) -> bool:
        """Whether every row is padding from here on: the request is then cancelled."""
        if ended := all(row.ended for row in self.rows):
            self.handle.cancel()
        return ended

    def _endings(self) -> Iterator[tuple[int, str]]:
        reasons = self.handle.finish_reasons or ()
        for i, row in enumerate(self.rows):
            if piece := row.end(reasons[i].openai if i < len(reasons) else "stop"):
                yield i, piece

    @property
    def choices(self) -> list[tuple[int, ChoiceText]]:
        """(choice index, its text) of every choice: greedy copies share their one row."""
        return [(c * self.copies + k, row) for c, row in enumerate(self.rows) for k in range(self.copies)]

    @property
    def completion_tokens(self) -> int:
        return sum(row.completion_tokens for _, row in self.choices)

    @property
    def finish_reason(self) -> str | None:
        """The first choice's (the one a single-choice request has)."""
        return self.rows[0].finish_reason
