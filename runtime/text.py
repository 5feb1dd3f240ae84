"""Turning generated token ids into text, incrementally.

Owns: streaming detokenization. Decoding the whole suffix each time (rather than token by token)
keeps multi-byte characters and merged word pieces intact; a piece is released once it no longer
ends in an incomplete character.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch


def stream_text(tokenizer, tokens: Iterable[torch.Tensor], skip_special_tokens: bool = True) -> Iterator[str]:
    """tokens yields (1,) id tensors of a single sequence; yields the new text after each, and at the end
    whatever is still held back, so the pieces join to `tokenizer.decode` of all the ids."""
    ids: list[int] = []
    emitted = ""
    text = ""
    for token in tokens:
        ids.append(int(token[0]))
        text = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            continue
        if len(text) > len(emitted) and text.startswith(emitted):
            yield text[len(emitted) :]
        emitted = text
    if text != emitted and text.startswith(emitted):  # the generation ended inside a character
        yield text[len(emitted) :]
