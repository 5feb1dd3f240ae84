"""The OpenAI request bodies aotpack serves, as pydantic models (FastAPI validates them).

Owns: which fields are accepted and their ranges. Unknown fields are ignored, as OpenAI-compatible
servers do, except those that would change the answer and are not implemented (`n` > 1, tools and
tool_choice, logprobs and top_logprobs, response_format other than text, logit_bias, frequency and
presence penalties; echo, suffix and best_of on completions), which are refused with a 400 naming the
field rather than silently dropped.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ImageURL(BaseModel):
    url: str


class ContentPart(BaseModel):
    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: ImageURL | None = None


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[ContentPart]


class Sampling(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    stream: bool = False
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    n: int = Field(default=1, ge=1, le=1)  # one choice per request
    stream_options: dict | None = None
    logprobs: bool | None = None
    tools: list | None = None
    # OpenAI fields aotpack does not implement yet: each would change the answer, so a value that is not
    # the field's no-op is refused rather than silently ignored.
    top_logprobs: int | None = None
    response_format: dict | None = None
    logit_bias: dict | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    tool_choice: str | dict | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else value
        if stops is not None and not all(stops):  # how many and how long: --max-stops, --max-stop-chars
            raise ValueError("stop takes non-empty strings")
        return stops

    @field_validator("logprobs", "tools", "top_logprobs", "logit_bias", "frequency_penalty", "presence_penalty")
    @classmethod
    def _unsupported(cls, value, info):
        if value:  # None, False, 0 and {} change nothing
            raise ValueError(f"{info.field_name} is not supported by aotpack serve")
        return value

    @field_validator("response_format")
    @classmethod
    def _plain_text_only(cls, value):
        if value is not None and value.get("type") != "text":
            raise ValueError(f"response_format {value.get('type')!r} is not supported by aotpack serve; only 'text'")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _no_tool_call(cls, value):
        if value not in (None, "none", "auto"):  # tools are refused, so "auto" and "none" call none
            raise ValueError("tool_choice is not supported by aotpack serve (tools are not)")
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    @property
    def token_budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(Sampling):
    prompt: str | list[str]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("echo", "suffix")
    @classmethod
    def _unsupported_completion(cls, value, info):
        if value:
            raise ValueError(f"{info.field_name} is not supported by aotpack serve")
        return value

    @field_validator("best_of")
    @classmethod
    def _one_best(cls, value):
        if value not in (None, 1):
            raise ValueError("best_of is not supported by aotpack serve (one choice per request)")
        return value

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list) and len(value) != 1:
            raise ValueError("prompt takes one string (a list of exactly one)")
        text = value[0] if isinstance(value, list) else value
        if not text:
            raise ValueError("prompt is empty")
        return text

    @property
    def token_budget(self) -> int | None:
        return self.max_tokens
