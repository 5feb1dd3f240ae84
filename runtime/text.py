"""Turning generated token ids into text, incrementally.

Owns: streaming detokenization. Each piece must join to what `tokenizer.decode` gives for all the ids
(multi-byte characters and merged word pieces intact). Where the tokenizer is a fast one whose decode
is transformers' own over the Rust decoder with nothing after it (no clean-up of spaces), the pieces
come from the tokenizers library's `DecodeStream`, which decodes a short window a token; elsewhere the
whole text is decoded again each token and the new suffix released once it no longer ends in an
incomplete character. The whole-text way costs what the text is long: 0.18 ms a token at 512 tokens of
Gemma 3 and 0.9 ms at 2,048, on a server's event loop for every stream.
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
        self.emitted: list[str] = []  # the pieces released so far
        self.stream = _decode_stream(tokenizer, skip_special_tokens)  # None: the whole text each token

    def add(self, token: int) -> str:
        self.ids.append(token)
        if self.stream is not None:
            try:
                piece = self.stream.step(self.tokenizer.backend_tokenizer, token) or ""  # None: held back
            except Exception:  # noqa: BLE001 (tokenizers raises a plain Exception)
                # its window's text no longer starts with what it released (ByteFallback rewrites a run of
                # bytes that is not UTF-8 as a whole: a stray continuation byte after a character): the
                # whole text from here on, as elsewhere
                self.stream = None
            else:
                self.emitted.append(piece)
                return piece
        text = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            return ""
        return self._release(text)

    def finish(self) -> str:
        """The rest of the text (the generation may have ended inside a character): one decode of it all."""
        return self._release(self.tokenizer.decode(self.ids, skip_special_tokens=self.skip))

    def _release(self, text: str) -> str:
        emitted = "".join(self.emitted)
        piece = text[len(emitted) :] if text.startswith(emitted) else ""
        self.emitted = [text]
        return piece


def _decode_stream(tokenizer, skip_special_tokens: bool):
    """tokenizers' DecodeStream where its pieces join to `tokenizer.decode`: a fast tokenizer whose decode is
    transformers' own, without clean-up of spaces (tested against decode on each preset's tokenizer and
    Gemma 3's). None elsewhere."""
    try:
        from tokenizers.decoders import DecodeStream
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    kind = type(tokenizer)
    own = kind.decode is PreTrainedTokenizerBase.decode and kind._decode is TokenizersBackend._decode
    if not own or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    return DecodeStream(skip_special_tokens=skip_special_tokens)


def stream_text(tokenizer, tokens: Iterable[torch.Tensor], skip_special_tokens: bool = True) -> Iterator[str]:
    """tokens yields (1,) id tensors of a single sequence; yields the new text after each, and at the end
    whatever is still held back, so the pieces join to `tokenizer.decode` of all the ids."""
    pieces = TextPieces(tokenizer, skip_special_tokens)
    for token in tokens:
        if piece := pieces.add(int(token[0])):
            yield piece
    if piece := pieces.finish():
        yield piece
