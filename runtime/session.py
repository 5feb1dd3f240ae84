"""Multi-turn chat that keeps its KV cache between turns: `rt.session()`.

Owns: a conversation's messages, the cache row it leases from the engine (runtime.engine.scheduler
.Lease), and deciding how much of that row each turn reuses. A turn renders the whole conversation with
the chat template (runtime.inputs), as a fresh `generate` would see it, and reuses the longest prefix of
those tokens whose keys and values the row already holds; only the rest is prefilled (the engine
continues the cache). So a turn's output is exactly what a fresh `generate` over the whole conversation
gives.

When the template renders an earlier reply as other tokens than were generated (trimmed whitespace,
say), the reusable prefix ends there. A row whose sliding-window ring has filled cannot step back (the
older window was overwritten), so it is then prefilled again from the start; so is a turn whose new
part holds an image (the continuing prefill is text only): runtime.engine.prefix has the rule.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, replace

import torch

from runtime.engine.prefix import reusable
from runtime.engine.sampling import checked_sampler
from runtime.errors import CacheOverflowError, InvalidInputError
from runtime.generation.outputs import streamed
from runtime.inputs import chat_inputs, conversation, user_message


@dataclass(frozen=True)
class Turn:
    """What one `send` did: the conversation's tokens, how many came from the cache, how many were
    prefilled, and how many were generated."""

    prompt_tokens: int
    reused: int
    prefilled: int
    new_tokens: int
    dropped_turns: int = 0


class Session:
    """A conversation over one cache row of a Runtime. Use as a context manager, or `close()` it: the
    row is the session's until then."""

    def __init__(
        self, rt, system: str | None = None, drop_oldest: bool = False, parse_special: bool = False, sampler="hf"
    ):
        self.rt = rt
        self.system = system
        self.sampler = checked_sampler(sampler)  # how sampled tokens are drawn (runtime.engine.sampling)
        self.parse_special = parse_special  # control-token strings in messages act as control tokens
        self.drop_oldest = drop_oldest  # when the cache would overflow: drop the oldest turns, or refuse
        self.messages: list[dict] = []
        self.last: Turn | None = None
        self._lease = rt.engine.lease()
        self._release = weakref.finalize(self, rt.engine.unlease, self._lease)  # also if never closed
        self._lock = threading.Lock()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Give the row back (after the turn in flight, if another thread is in one)."""
        with self._lock:
            self._release()
            self._lease = None

    def reset(self) -> None:
        """Forget the conversation (the system prompt stays); the next turn starts from an empty row."""
        with self._lock:
            self.messages = []
            if self._lease is not None:
                self._lease.held = None

    def send(self, message=None, images=(), streamer=None, **generate_kwargs) -> str:
        """Add a user turn (text, or a message dict / list of them) and generate the reply; returns its
        text. `generate_kwargs` are `generate`'s (max_new_tokens, do_sample, stop_strings, ...); a
        streamer sees the reply as it is generated. Interrupted (Ctrl-C), the reply so far is kept; a
        turn refused or failed before any reply leaves the conversation as it was."""
        with self._lock:
            if self._lease is None:
                raise InvalidInputError("this session is closed; open another with rt.session()")
            _check_turn_options(generate_kwargs)
            before = list(self.messages)
            self.messages += _user_messages(message, images)
            try:
                request, dropped = self._request(generate_kwargs)
                if request.input_ids.shape[0] != 1:
                    raise InvalidInputError(
                        f"a session's turn is one sequence in its one cache row, not {request.input_ids.shape[0]}; "
                        "drop num_return_sequences, or use rt.generate for several"
                    )
                return self._run(request, streamer, dropped)
            except BaseException:
                if self.messages and self.messages[-1]["role"] != "assistant":
                    self.messages = before  # no reply came: the turn did not happen
                raise

    def _request(self, generate_kwargs: dict):
        """The validated request for the conversation; with `drop_oldest`, the oldest turns go until it
        fits the cache."""
        dropped = 0
        while True:
            try:
                return replace(self.rt.request(**self._inputs(), **generate_kwargs), sampler=self.sampler), dropped
            except CacheOverflowError:
                if not (self.drop_oldest and self._drop_oldest_turn()):
                    raise
                dropped += 1

    def _run(self, request, streamer, dropped: int) -> str:
        ids = request.input_ids  # (1, T)
        reuse = self._reusable(request)
        handle = self.rt.engine.submit(request, lease=self._lease, reuse=reuse)
        tokens = []
        try:
            for token, _ in streamed(handle, streamer):
                tokens.append(token)
        finally:  # what the caller saw is the reply, also when interrupted (Ctrl-C)
            # Interrupted, the request is only cancelled: the engine records what the row holds when it
            # releases it, before its next step. The next turn reads that record, so wait for it (a turn
            # sent at once found the record of the turn before and reused nothing).
            handle.wait()
            reply = self.rt.tokenizer.decode(torch.cat(tokens).tolist(), skip_special_tokens=True) if tokens else ""
            if tokens:
                self.messages.append({"role": "assistant", "content": reply})
            self.last = Turn(ids.shape[1], reuse, ids.shape[1] - 1 - reuse, len(tokens), dropped)
        return reply

    def _inputs(self) -> dict:
        return chat_inputs(self.rt, conversation(self.system, self.messages), self.parse_special)

    def _reusable(self, request) -> int:
        """How many leading tokens of the request's prompt the row holds already (runtime.engine.prefix:
        the images among them are the conversation's own)."""
        held = self._lease.held
        if held is None:
            return 0
        return reusable(held, request.input_ids, request.attention_mask, self.rt.contract.layout, self.rt.model.config)

    def _drop_oldest_turn(self) -> bool:
        """Remove the oldest user turn and what answered it; False when only the newest is left."""
        starts = [i for i, m in enumerate(self.messages) if m["role"] == "user"]
        if len(starts) < 2:
            return False
        self.messages = self.messages[starts[1] :]
        return True


def _check_turn_options(generate_kwargs: dict) -> None:
    """A turn's prompt is the conversation: the session renders and tokenizes it itself."""
    given = sorted({"input_ids", "attention_mask", "inputs_embeds"} & set(generate_kwargs))
    if given:
        raise InvalidInputError(
            f"send() takes the user's message, not {', '.join(given)}: the session builds the prompt from the "
            "conversation; pass text (or chat messages), or call rt.generate with token ids"
        )


def _user_messages(message, images) -> list[dict]:
    if isinstance(message, str):
        return [user_message(message, images)]
    messages = [message] if isinstance(message, dict) else message
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise InvalidInputError(
            f"send() takes text, a chat message dict or a list of them, got {type(message).__name__} "
            f"{str(message)[:40]!r}; token ids go to rt.generate"
        )
    return list(messages)
