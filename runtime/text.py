"""Turning generated token ids into text, incrementally.

Owns: streaming detokenization. Decoding the whole suffix each time (rather than token by token)
keeps multi-byte characters and merged word pieces intact; a piece is released once it no longer
ends in an incomplete character.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch


class TextPieces:
    """One sequence's text, a piece per token: `add` returns what the new token adds (empty while a
    multi-byte character is incomplete), `finish` whatever is still held back."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.emitted = self.text = ""

    def add(self, token: int) -> str:
        self.ids.append(token)
        self.text = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip)
        if self.text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            return ""
        return self._release()

    def finish(self) -> str:
        return self._release()  # the generation may have ended inside a character

    def _release(self) -> str:
        piece = self.text[len(self.emitted) :] if self.text.startswith(self.emitted) else ""
        self.emitted = self.text
        return piece


def stream_text(tokenizer, tokens: Iterable[torch.Tensor], skip_special_tokens: bool = True) -> Iterator[str]:
    """tokens yields (1,) id tensors of a single sequence; yields the new text after each, and at the end
    whatever is still held back, so the pieces join to `tokenizer.decode` of all the ids."""
    pieces = TextPieces(tokenizer, skip_special_tokens)
    for token in tokens:
        if piece := pieces.add(int(token[0])):
            yield piece
    if piece := pieces.finish():
        yield piece
