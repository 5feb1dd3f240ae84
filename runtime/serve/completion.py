"""One OpenAI request through the engine, as text: sampling options, stop strings and finish reason.

Owns: mapping OpenAI's sampling fields onto `generate` options, and `TextStream`, which turns a
request's tokens into text pieces cut at the first stop string (excluded, as OpenAI does) while
holding back only as much text as could still start one, and says why the reply ended: "stop" when it
cut at a stop string, else what the engine recorded (runtime.engine.status.FinishReason.openai).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from runtime.errors import InvalidInputError
from runtime.text import stream_text


def check_stops(stops: list[str] | None, max_stops: int, max_chars: int) -> None:
    """The server's bounds on stop strings (--max-stops, --max-stop-chars): each is matched against the
    reply's text at every token (a 1-million-character one took 16 s and 2.7 GB)."""
    if stops and len(stops) > max_stops:
        raise InvalidInputError(f"{len(stops)} stop strings; this server takes at most {max_stops}")
    if stops and max(map(len, stops)) > max_chars:
        raise InvalidInputError(f"each stop string is at most {max_chars} characters")


def generate_options(request, rt, prompt_tokens: int) -> dict:
    """OpenAI fields -> `rt.submit` keyword arguments. temperature 0 is greedy; no sampling field at all
    keeps the bundle's generation defaults; no max_tokens means up to the end of the cache."""
    options: dict = {"max_new_tokens": request.token_budget or max(1, rt.contract.max_cache_len - prompt_tokens)}
    if request.temperature == 0:
        options["do_sample"] = False
    elif request.temperature is not None or request.top_p is not None:
        options |= {"do_sample": True, "temperature": request.temperature or 1.0, "top_p": request.top_p or 1.0}
    if request.stop:
        options["stop_strings"] = list(request.stop)
    if request.seed is not None:
        options["generator"] = torch.Generator(rt.contract.device).manual_seed(request.seed)
    return options


class TextStream:
    """Iterate for text pieces; afterwards `finish_reason` and `completion_tokens` are set."""

    def __init__(self, tokenizer, handle, stops: list[str] | None):
        self.tokenizer, self.handle = tokenizer, handle
        self.stops = list(stops or [])
        self.completion_tokens = 0
        self.finish_reason: str | None = None

    def _tokens(self) -> Iterator[torch.Tensor]:
        for token in self.handle.tokens():
            self.completion_tokens += 1
            yield token

    def __iter__(self) -> Iterator[str]:
        hold = max((len(s) for s in self.stops), default=1) - 1  # characters that could start a stop
        text, sent = "", 0
        for piece in stream_text(self.tokenizer, self._tokens()):
            text += piece
            cut = self._first_stop(text, max(0, sent - hold))
            if cut is not None:
                self.finish_reason = "stop"
                self.handle.cancel()
                if cut > sent:
                    yield text[sent:cut]
                return
            if len(text) - hold > sent:
                yield text[sent : len(text) - hold]
                sent = len(text) - hold
        if len(text) > sent:
            yield text[sent:]
        self.finish_reason = self.handle.finish_reasons[0].openai

    def _first_stop(self, text: str, start: int) -> int | None:
        found = [i for s in self.stops if (i := text.find(s, start)) >= 0]
        return min(found) if found else None
