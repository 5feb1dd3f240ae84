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


class Reply:
    """The bodies of one "chat" or "text" completion, over the TextStream that makes its choices."""

    def __init__(self, kind: str, model: str, prompt_tokens: int, text: TextStream, calls=None):
        """`calls`: for a request with tools, a choice's token ids -> (content, OpenAI tool_calls)
        (runtime.serve.tools.parse); its text is then held back and parsed once the choice has ended."""
        self.kind, self.model, self.prompt_tokens, self.text, self.calls = kind, model, prompt_tokens, text, calls
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
        # every served prompt is prefilled whole (no prefix reuse across requests yet): none came from a cache
        return usage | {"prompt_tokens_details": {"cached_tokens": 0}}

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
        """A chat choice's message and finish reason: with tools, what the parser read in its tokens."""
        if self.calls is None:
            return {"role": "assistant", "content": row.content}, row.finish_reason
        content, calls = self.calls(row.pieces.ids)
        if not calls:
            return {"role": "assistant", "content": content or ""}, row.finish_reason
        return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"

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
        if self.calls is not None:  # held back: a call's markup must not reach the client as content
            return []
        choice = self.text.rows[row]
        scored = choice.taken()
        return [self._piece(index, choice, piece, scored) for index, c in self.text.choices if c is choice]

    def closing(self) -> list[dict]:
        """Each choice's last chunk, with its finish reason (and the logprobs of text held back to the end)."""
        scored = self._remaining()
        if self.calls is not None:
            return [chunk for index, row in self.text.choices for chunk in self._parsed(index, row, scored[id(row)])]
        return [self._piece(index, row, None, scored[id(row)]) for index, row in self.text.choices]

    def _parsed(self, index: int, row: ChoiceText, scored: list) -> list[dict]:
        """A tool request's choice, streamed once it has ended: its content, each call as a tool_calls
        delta (the whole arguments in one), and the finish."""
        message, finish = self._message(row)
        chunks = [self._delta(index, {"content": message["content"]}, self._logprobs(index, row.content, scored))]
        chunks += [
            self._delta(index, {"tool_calls": [{"index": k} | call]})
            for k, call in enumerate(message.get("tool_calls", []))
        ]
        return chunks + [self._delta(index, {}, finish=finish)]

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
