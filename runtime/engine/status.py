"""A request's status and why its sequences ended: plain enums, shared by the scheduler (torch-free) and
the request state."""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    WAITING = "waiting"  # queued for cache rows
    PREFILLING = "prefilling"  # has rows; the prompt is going into the cache (in chunks, perhaps)
    DECODING = "decoding"  # every decode step advances it by one token
    FINISHED = "finished"


class FinishReason(str, Enum):
    """Why a sequence ended; `openai` is what an OpenAI-compatible server reports for it."""

    EOS = "eos"  # it produced an eos id
    STOP_STRING = "stop_string"  # its text reached one of the request's stop_strings
    CRITERION = "criterion"  # a caller's stopping criterion ended it
    TIME = "time"  # max_time
    LENGTH = "length"  # max_new_tokens (or max_length)
    CANCELLED = "cancelled"  # cancelled by its caller, or by the engine closing
    FAILED = "failed"  # its prefill or decode step raised

    @property
    def openai(self) -> str:
        """OpenAI's "stop" or "length"; vLLM's "abort" and "error" for the rest."""
        return _OPENAI[self]


_OPENAI = {
    FinishReason.EOS: "stop",
    FinishReason.STOP_STRING: "stop",
    FinishReason.CRITERION: "stop",
    FinishReason.TIME: "length",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "abort",
    FinishReason.FAILED: "error",
}
