"""The OpenAI request bodies aotpack serves, as pydantic models (FastAPI validates them).

Owns: which fields are accepted and their ranges. Unknown fields are ignored, as OpenAI-compatible
servers do, except those that would change the answer and are not implemented (echo, suffix, best_of
and tools on completions; audio output; parallel_tool_calls=false with tool_choice auto), which are
refused with a 400 naming the field rather than silently dropped.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from runtime.serve.logprobs import MAX_TOP

MAX_CHOICES = 128  # n at most (vLLM's bound); sampled choices are also bounded by the bundle's rows


class ImageURL(BaseModel):
    url: str


class ContentPart(BaseModel):
    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: ImageURL | None = None


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[ContentPart] | None = None  # None only beside an assistant's tool_calls
    tool_calls: list[dict] | None = None  # an assistant's earlier calls: {"id", "type", "function": {name, arguments}}
    tool_call_id: str | None = None  # a tool message's: the call it answers

    @model_validator(mode="after")
    def _content_or_calls(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"the {self.role} message needs its content (an assistant's may give tool_calls instead)")
        return self


class Function(BaseModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict | None = None  # a JSON schema of the arguments


class Tool(BaseModel):
    type: Literal["function"]
    function: Function


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
    n: int = 1  # choices (sampled ones each take a cache row: runtime.serve.completion.n_choices)
    stream_options: dict | None = None
    # OpenAI's additive penalties over the tokens generated so far (runtime.generation.penalties), and a
    # bias added to given tokens' logits (HF's sequence_bias): both before temperature and top_p
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    # vLLM's sampling extensions, as HF generate takes them (runtime.serve.completion.generate_options):
    # top_k (-1 or 0: off) and min_p rank and cut what is sampled; repetition_penalty is HF's (and vLLM's)
    # multiplicative one over prompt and reply, greedy too; min_tokens keeps the stop tokens away until then
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0, le=2)
    min_tokens: int | None = Field(default=None, ge=0)
    # aotpack's extension, HF generate's name: drafted tokens a step by prompt lookup, up to the bundle's
    # --speculate (0: none; unset: the bundle's for greedy requests, none for sampled ones)
    prompt_lookup_num_tokens: int | None = Field(default=None, ge=0, le=64)
    # OpenAI fields aotpack does not implement yet: each would change the answer, so a value that is not
    # the field's no-op is refused rather than silently ignored.
    # Structured output (runtime.generation.grammar): OpenAI's response_format, or vLLM's
    # structured_outputs ({"json"|"regex"|"choice"|"grammar": ...}) and its older guided_* fields
    response_format: dict | None = None
    structured_outputs: dict | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else value
        if stops is not None and not all(stops):  # how many and how long: --max-stops, --max-stop-chars
            raise ValueError("stop takes non-empty strings")
        return stops

    @field_validator("n")
    @classmethod
    def _some_choices(cls, value):
        if not 1 <= value <= MAX_CHOICES:
            raise ValueError(f"n must be from 1 to {MAX_CHOICES}, got {value}")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _biases(cls, value):
        for key, bias in (value or {}).items():
            if not key.isdigit():
                raise ValueError(f"logit_bias keys are token ids, as strings of digits; got {key!r:.40}")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias of token {key} is {bias}; biases go from -100 to 100")
        return value

    @field_validator("response_format")
    @classmethod
    def _known_format(cls, value):
        kind = (value or {}).get("type", "text")
        if kind not in ("text", "json_object", "json_schema"):
            raise ValueError(f"response_format type {kind!r} is not one of 'text', 'json_object', 'json_schema'")
        if kind == "json_schema" and not isinstance((value.get("json_schema") or {}).get("schema"), dict):
            raise ValueError('response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}')
        return value

    @model_validator(mode="after")
    def _min_within_max(self):
        budget = self.token_budget
        if self.min_tokens and budget is not None and self.min_tokens > budget:
            raise ValueError(f"min_tokens={self.min_tokens} is more than the {budget} tokens the request allows")
        return self

    @property
    def token_budget(self) -> int | None:
        return self.max_tokens

    @model_validator(mode="after")
    def _one_format(self):
        formats = self._formats()
        if len(formats) > 1:
            raise ValueError(f"one output format per request, got {len(formats)}: {', '.join(f for f, _ in formats)}")
        return self

    def _formats(self) -> list[tuple[str, tuple[str, object]]]:
        """(the field that gave it, (runtime.generation.grammar kind, spec)) for each format asked for."""
        kind = (self.response_format or {}).get("type", "text")
        given = [("response_format", ("json_schema", True))] if kind == "json_object" else []
        if kind == "json_schema":
            given.append(("response_format", ("json_schema", self.response_format["json_schema"]["schema"])))
        vllm = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "lark"}
        for name, spec in (self.structured_outputs or {}).items():
            if name not in vllm:
                raise ValueError(f"structured_outputs.{name} is not one of {', '.join(vllm)}")
            given.append((f"structured_outputs.{name}", (vllm[name], spec)))
        for name in ("json", "regex", "choice", "grammar"):
            if (spec := getattr(self, f"guided_{name}")) is not None:
                given.append(
                    (
                        f"guided_{name}",
                        (vllm[name], json.loads(spec) if isinstance(spec, str) and name == "json" else spec),
                    )
                )
        return given

    @property
    def output_format(self) -> tuple[str, object] | None:
        """(kind, spec) of the format the output is held to, or None for free text."""
        formats = self._formats()
        return formats[0][1] if formats else None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = False  # each generated token's log-probability (runtime.serve.logprobs)
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP)  # and that many alternatives each
    # vLLM's extensions, passed to the chat template: continue the last (assistant) message instead of
    # opening a new turn, or leave the assistant's turn unopened
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # Tool calling (runtime.serve.tools): the tools go through the chat template; "required" or a named
    # function holds the reply to one call whose arguments follow its parameters' schema
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict | None = None
    parallel_tool_calls: bool | None = None  # "auto" parses every call the reply holds; "required" makes one
    # Output in other modalities: text only. Refused unless they ask for text alone
    audio: dict | None = None
    modalities: list[str] | None = None

    @model_validator(mode="after")
    def _text_only(self):
        if self.audio is not None or (self.modalities is not None and self.modalities != ["text"]):
            asked = "audio" if self.audio is not None else f"modalities {self.modalities}"
            raise ValueError(f"{asked}: aotpack serve replies in text only; send modalities ['text'] or leave it out")
        return self

    @model_validator(mode="after")
    def _one_call_at_most(self):
        if self.parallel_tool_calls is False and self.tool_mode == "auto":
            raise ValueError(
                "parallel_tool_calls=false with tool_choice 'auto' is not supported (every call the reply "
                "holds is returned): send tool_choice 'required' or a named function, which make one call"
            )
        return self

    @model_validator(mode="after")
    def _choice_among_tools(self):
        names = [t.function.name for t in self.tools or []]
        choice = self.tool_choice
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            if choice.get("type") != "function" or name not in names:
                raise ValueError(
                    f"tool_choice {json.dumps(choice)[:80]} names no tool of this request; "
                    f'send {{"type": "function", "function": {{"name": one of {names}}}}}'
                )
        elif choice == "required" and not names:
            raise ValueError("tool_choice 'required' needs tools")
        return self

    @property
    def tool_mode(self) -> str | None:
        """None (no tools, or "none": the reply is text), "auto", "required", or the named function."""
        if not self.tools or self.tool_choice == "none":
            return None
        choice = self.tool_choice or "auto"
        return choice["function"]["name"] if isinstance(choice, dict) else choice

    @property
    def tool_dicts(self) -> list[dict] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    @model_validator(mode="after")
    def _alternatives_need_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError(f"top_logprobs={self.top_logprobs} lists alternatives to logprobs: send logprobs=true too")
        return self

    @property
    def alternatives(self) -> int | None:
        """How many top alternatives each token's logprobs list; None: no logprobs asked for."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @model_validator(mode="after")
    def _continue_the_assistant(self):
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError(
                "continue_final_message continues the last message, add_generation_prompt opens a new turn: "
                "send add_generation_prompt=false with continue_final_message=true"
            )
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise ValueError(
                f"continue_final_message continues the last message, which is the {self.messages[-1].role}'s; "
                "end the messages with the assistant's partial reply"
            )
        return self

    @property
    def token_budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(Sampling):
    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP)  # the legacy API's: alternatives per token
    tools: list | None = None  # a chat completions field: refused here by name
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("echo", "suffix", "tools")
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
    def alternatives(self) -> int | None:
        return self.logprobs
