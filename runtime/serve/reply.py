"""The OpenAI response bodies of one request: a whole reply, its stream's chunks, and their usage.

Owns: the JSON shapes of chat completions and legacy completions, whole and streamed, one choice per
`n` with its own index, finish reason and, when the request asked for them, `logprobs`
(runtime.serve.logprobs) of the tokens behind each piece; and `usage`.
"""

from __future__ import annotations

import json
import time
import uuid

from runtime.serve.choices import ChoiceText, TextStream
from runtime.serve.logprobs import chat_logprobs, completion_logprobs
from runtime.serve.toolstream import folded


class Reply:
    """The bodies of one "chat" or "text" completion, over the TextStream that makes its choices."""

    def __init__(self, kind: str, model: str, prompt_tokens: int, text: TextStream, reader=None):
        """`reader`: for a request with tools, makes a choice's ReplyReader (runtime.serve.toolstream),
        which reads its tokens into content, reasoning and tool-call deltas as they arrive."""
        self.kind, self.model, self.prompt_tokens, self.text = kind, model, prompt_tokens, text
        self.reader, self.readers = reader, {}
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.sent: dict[int, int] = {}  # characters of each choice handed out: a completion's text_offset

    def _body(self, obj: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def _logprobs(self, index: int, piece: str, scored: list) -> dict | None:
        """The logprobs of `scored`, the tokens behind `piece` (None when the request asked for none)."""
        if self.text.alternatives is None:
            return None
        offset = self.sent.get(index, 0)
        self.sent[index] = offset + len(piece)
        if self.kind == "chat":
            return chat_logprobs(self.text.tokenizer, scored)
        return completion_logprobs(self.text.tokenizer, scored, offset)

    def usage(self) -> dict:
        done, prompt = self.text.completion_tokens, self.prompt_tokens
        usage = {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}
        return usage | {"prompt_tokens_details": {"cached_tokens": self.text.handle.cached_tokens}}

    def whole(self) -> dict:
        """The whole reply, once every choice has ended."""
        scored = self._remaining()
        choices = []
        for index, row in self.text.choices:
            message, finish = self._message(row)
            done = {"logprobs": self._logprobs(index, row.content, scored[id(row)]), "finish_reason": finish}
            if self.kind == "chat":
                choices.append({"index": index, "message": message} | done)
            else:
                choices.append({"index": index, "text": row.content} | done)
        body = self._body("chat.completion" if self.kind == "chat" else "text_completion", choices)
        return body | {"usage": self.usage()}

    def _message(self, row: ChoiceText) -> tuple[dict, str | None]:
        """A chat choice's message and finish reason: with tools, what its reader read in its tokens."""
        if self.reader is None:
            return {"role": "assistant", "content": row.content}, row.finish_reason
        reader = self._reader(row)
        message = folded(reader.finish(row.pieces.ids))
        if "tool_calls" not in message:
            message["content"] = message["content"] or ""
        return message, self._finish(row, reader)

    def _reader(self, row: ChoiceText):
        """The row's ReplyReader: one a row, which greedy copies share."""
        if id(row) not in self.readers:
            self.readers[id(row)] = self.reader()
        return self.readers[id(row)]

    @staticmethod
    def _finish(row: ChoiceText, reader) -> str | None:
        """A choice that ended on its own having made a whole call finishes with "tool_calls"; one whose call
        the token budget or a stop string cut short, with "length" or "stop"."""
        return "tool_calls" if reader.called and row.finish_reason == "stop" else row.finish_reason

    def _remaining(self) -> dict[int, list]:
        """Each row's tokens not yet handed out, by id(row): greedy copies share their row's."""
        return {id(row): row.taken() for row in self.text.rows}

    def opening(self) -> list[dict]:
        """A chat stream opens each choice with the role, as OpenAI does (a completion stream does not)."""
        if self.kind != "chat":
            return []
        return [self._delta(i, {"role": "assistant", "content": ""}) for i, _ in self.text.choices]

    def pieces(self, row: int, piece: str) -> list[dict]:
        """The chunks of one row's new text: one per choice that row makes (greedy copies share it)."""
        choice = self.text.rows[row]
        if self.reader is not None:
            return self._read(choice, self._reader(choice).feed(choice.pieces.ids))
        scored = choice.taken()
        return [self._piece(index, choice, piece, scored) for index, c in self.text.choices if c is choice]

    def closing(self) -> list[dict]:
        """Each choice's last chunk, with its finish reason (and the logprobs of text held back to the end)."""
        if self.reader is not None:
            ends = [(row, self._reader(row).finish(row.pieces.ids)) for row in self.text.rows]
            return [chunk for row, deltas in ends for chunk in self._read(row, deltas, last=True)]
        scored = self._remaining()
        return [self._piece(index, row, None, scored[id(row)]) for index, row in self.text.choices]

    def _read(self, row: ChoiceText, deltas: list[dict], last: bool = False) -> list[dict]:
        """A tool request's chunks of `deltas`, what the row's reader let out (markup that may still turn
        into a call is held back), for each choice the row makes; the tokens' logprobs ride on the first
        chunk that follows them, and `last` adds the finish."""
        scored = row.taken() if deltas or last else []  # copies share the row's tokens: taken once, sent to each
        reader = self._reader(row)
        chunks = []
        for index in (i for i, c in self.text.choices if c is row):
            logprobs = self._logprobs(index, "", scored) if scored else None
            chunks += [self._delta(index, delta, logprobs if k == 0 else None) for k, delta in enumerate(deltas)]
            if last:
                chunks.append(self._delta(index, {}, None if deltas else logprobs, self._finish(row, reader)))
        return chunks

    def _piece(self, index: int, row: ChoiceText, piece: str | None, scored: list) -> dict:
        logprobs = self._logprobs(index, piece or "", scored) if piece is not None or scored else None
        finish = row.finish_reason if piece is None else None
        if self.kind == "chat":
            return self._delta(index, {} if piece is None else {"content": piece}, logprobs, finish)
        return self._chunk([{"index": index, "text": piece or "", "logprobs": logprobs, "finish_reason": finish}])

    def _delta(self, index: int, delta: dict, logprobs: dict | None = None, finish: str | None = None) -> dict:
        """A chat stream's chunk of one choice."""
        return self._chunk([{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}])

    def _chunk(self, choices: list[dict]) -> dict:
        return self._body("chat.completion.chunk" if self.kind == "chat" else "text_completion", choices)

    def usage_chunk(self) -> dict:
        return self._chunk([]) | {"usage": self.usage()}

    @staticmethod
    def event(payload: dict) -> str:
        return f"data: {json.dumps(payload)}\n\n"
