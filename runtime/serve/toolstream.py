"""A tool request's reply read as its tokens arrive: OpenAI deltas of content, reasoning and tool calls.

Owns: turning transformers' streaming response parser's events (runtime.compat.response_parser, the
reader behind tokenizer.parse_response) into OpenAI's chat deltas. Content and reasoning go out as
they are written; the parser holds back only text that could start a call's markup. A call whose
body is JSON naming the function before its arguments (`{"name": ..., "arguments": {...}}`, the
`<tool_call>` format of Qwen, Hermes and SmolLM) goes out as the model writes it: the id and name once
the name is complete, then the arguments object's text piece by piece, as vLLM and llama-server stream
them. Any other call goes out whole when the parser closes it, its arguments as the parser read them.
A whole (non-streamed) reply is these same deltas folded together, so both agree.

Stop strings cut the model's text before the parser reads it (runtime.serve.choices.StopCut, over the text
with the markup's special tokens), as vLLM applies them to the raw output: what follows a stop is never
read, content or call. A call the cut leaves open goes out as far as it was written, as one cut by the
token budget does, and is not complete: the choice then finishes with "stop", not "tool_calls".
"""

from __future__ import annotations

import json
import re
import uuid

from runtime import compat
from runtime.serve.choices import StopCut
from runtime.text import TextPieces

# The head of a JSON call body up to its arguments' value: the name must come first to be streamed.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


class _Call:
    """One call's region: its raw text so far, and how much of its arguments has gone out."""

    def __init__(self, index: int):
        self.index, self.id = index, f"call_{uuid.uuid4().hex[:24]}"
        self.body, self.sent, self.arguments_at = "", 0, None  # arguments_at: where they start, once streamed
        self.complete = False  # the parser read it whole: its markup closed and its body parsed

    def grow(self, text: str) -> list[dict]:
        """The deltas `text`, more of the call's body, lets out (none until the name is complete)."""
        self.body += text
        if self.arguments_at is None:
            head = _HEAD.match(self.body)
            arguments = self.body[head.end() :].lstrip() if head else ""
            if not arguments.startswith("{"):  # not yet, or not an object: the call goes out whole at its close
                return []
            self.arguments_at = len(self.body) - len(arguments)
            name = json.loads(f'"{head.group(1)}"')
            return [self._delta({"name": name, "arguments": ""}, first=True), *self._arguments()]
        return self._arguments()

    @property
    def opened(self) -> bool:
        """Whether its id and name have gone out (its arguments then follow as written)."""
        return self.arguments_at is not None

    def close(self, value, complete: bool = True) -> list[dict]:
        """The call's last deltas, once the parser has closed it (`value`: its parsed call; not `complete`
        where its body did not parse, e.g. cut short)."""
        self.complete = complete
        if self.opened:
            return self._arguments()
        function = value.get("function", {}) if isinstance(value, dict) else {}
        arguments = function.get("arguments", {})
        arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
        return [self._delta({"name": function.get("name", ""), "arguments": arguments}, first=True)]

    def _arguments(self) -> list[dict]:
        """The arguments' text written since the last delta, up to the end of their object."""
        written = self.body[self.arguments_at : self.arguments_at + _object_length(self.body[self.arguments_at :])]
        piece, self.sent = written[self.sent :], len(written)
        return [self._delta({"arguments": piece})] if piece else []

    def _delta(self, function: dict, first: bool = False) -> dict:
        call = {"index": self.index, "id": self.id, "type": "function"} if first else {"index": self.index}
        return {"tool_calls": [call | {"function": function}]}


def _object_length(text: str) -> int:
    """Characters of the JSON object `text` starts with: all of them while it is still open."""
    depth, quoted, escaped = 0, False, False
    for i, char in enumerate(text):
        if quoted:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


class ReplyReader:
    """One choice's tokens in, OpenAI deltas out: `feed` the row's ids so far, `finish` with all of them;
    the text after the first of `stops` is not read."""

    def __init__(self, tokenizer, template: dict, prefix: str, tools: list[dict], stops: list[str] | None = None):
        self.parser = compat.response_parser(template, prefix, tools)
        self.text = TextPieces(tokenizer, skip_special_tokens=False)  # the markup may be special tokens
        self.cut = StopCut(list(stops or []))
        self.stripped = {name: _strips(f) for name, f in template["fields"].items() if name in _TEXT_FIELDS}
        self.calls: list[_Call] = []
        self.fresh, self.held = True, ""  # a text region's start, and whitespace that may be its end
        # how far the parser's regions have been found in what it read (self.cut's text let out: each
        # text value and call body searched for from there), and the whitespace after the content just
        # before a call's markup: a failed call's text goes after it
        self.scan, self.gap = 0, ""
        self.specials = tuple(t for t in tokenizer.all_special_tokens if t)  # ends a region may run into

    def feed(self, ids: list[int]) -> list[dict]:
        """The deltas of the ids not seen before (`ids`: all of the row's so far)."""
        piece = self.cut.add("".join(self.text.add(token) for token in ids[len(self.text.ids) :]))
        return self._deltas(self.parser.feed(piece)) if piece else []

    def finish(self, ids: list[int]) -> list[dict]:
        """The last deltas, once the row has ended with `ids`."""
        deltas = self.feed(ids) + self._deltas(self.parser.feed(self.cut.add(self.text.finish(), final=True)))
        return deltas + self._deltas(self.parser.finalize()[1])

    @property
    def called(self) -> bool:
        """Whether the reply holds a call the parser read whole (what finishes a choice with "tool_calls")."""
        return any(call.complete for call in self.calls)

    def _deltas(self, events: list[dict]) -> list[dict]:
        out = []
        for event in events:
            kind, field = event["type"], event.get("field")
            if field == "tool_calls":
                out += self._call(kind, event)
            elif field in _TEXT_FIELDS:
                out += self._text(kind, field, event)
        return out

    def _text(self, kind: str, field: str, event: dict) -> list[dict]:
        """A text region's chunk, less the whitespace at its two ends where the parser strips it (so the
        streamed text is the parsed text)."""
        if kind == "region_close":  # the gap after content (not after reasoning) until a call uses it
            end = self._found(event.get("value") or "")
            rest = self.cut.text[end : self.cut.sent] if field == "content" and end is not None else ""
            self.gap = rest[: len(rest) - len(rest.lstrip())]
        if kind != "region_chunk":  # a closed region's trailing whitespace is dropped with it
            self.fresh, self.held = True, ""
            return []
        text = event["text"]
        if not self.stripped[field]:
            return [{field: text}]
        text = self.held + (text.lstrip() if self.fresh else text)
        body = text.rstrip()
        self.fresh, self.held = self.fresh and not body, text[len(body) :]
        return [{field: body}] if body else []

    def _found(self, text: str) -> int | None:
        """Where `text`, a region's value or body, ends in what was read (searched past the regions found
        before it, so a value is not matched inside an earlier call); None where it is not there."""
        end = self.cut.text.find(text, self.scan, self.cut.sent) if text else -1
        if end < 0:
            return None
        self.scan = end + len(text)
        return self.scan

    def _call(self, kind: str, event: dict) -> list[dict]:
        if kind == "region_open":
            self.calls.append(_Call(len(self.calls)))
            return []
        call = self.calls[-1]
        if kind == "region_chunk":
            return call.grow(event["text"])
        self._found(call.body)
        gap, self.gap = self.gap, ""
        if event.get("error") and not call.opened:  # not a call after all: what the model wrote is text
            self.calls.pop()
            text = self._unmarked(call.body)
            return [{"content": gap + text}] if text else []
        return call.close(event.get("value"), complete=not event.get("error"))

    def _unmarked(self, body: str) -> str:
        """A failed call's body as text: stripped, less the special tokens (an end of turn) that an
        unclosed call region ran into."""
        body = body.strip()
        while self.specials and body.endswith(self.specials):
            body = body[: -len(next(t for t in self.specials if body.endswith(t)))].rstrip()
        return body


_TEXT_FIELDS = ("content", "reasoning_content")


def _strips(field: dict) -> bool:
    """Whether transformers strips a text field's value at its ends (its default)."""
    return field.get("content", "text") == "text" and (field.get("content_args") or {}).get("strip", True)


def folded(deltas: list[dict]) -> dict:
    """A whole message from a reply's deltas: texts joined, each call's arguments joined."""
    message: dict = {"role": "assistant", "content": None}
    calls: dict[int, dict] = {}
    for delta in deltas:
        for field in ("content", "reasoning_content"):
            if field in delta:
                message[field] = (message.get(field) or "") + delta[field]
        for part in delta.get("tool_calls", []):
            call = calls.setdefault(part["index"], {"id": part.get("id"), "type": "function", "function": {}})
            call["id"] = part.get("id", call["id"])
            for key, value in part["function"].items():
                call["function"][key] = call["function"].get(key, "") + value
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message
