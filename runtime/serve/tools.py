"""Tool calling: OpenAI's `tools` and `tool_choice` through the checkpoint's own chat template and
transformers' own response templates.

Owns: checking that a bundle can take tools (its chat template renders them, and transformers knows
how its model writes a call: the tokenizer's `response_template`, else transformers' fallback for the
model type), the grammar that holds `tool_choice` "required" or a named function to a call whose
arguments follow the tool's parameter schema (llguidance, runtime.generation.grammar). Reading a
reply into OpenAI's `tool_calls` is runtime.serve.toolstream's. Constrained calls are built for calls
written as JSON between two fixed markers (`<tool_call>{json}</tool_call>`: Qwen 2.5/3, Hermes, and a
bundle's own response template of that kind); other formats take `auto` only.
"""

from __future__ import annotations

import json
import re

from runtime import compat
from runtime.errors import InvalidInputError


def response_template(rt) -> dict:
    """How this bundle's model writes a tool call, or a 400 that says it cannot take tools."""
    template = getattr(rt.processor, "chat_template", None) or ""
    if "tools" not in template:
        raise InvalidInputError("this bundle's chat template does not render tools; send the request without tools")
    parsing = compat.response_template(rt.tokenizer, rt.model)
    if parsing is None or "tool_calls" not in parsing.get("fields", {}):
        kind = rt.model.config.model_type
        raise InvalidInputError(
            f"transformers knows no tool-call format for model type {kind!r} (the tokenizer has no "
            "response_template): its calls could not be parsed; send the request without tools"
        )
    return parsing


def call_grammar(rt, tools: list[dict], name: str | None) -> str:
    """A lark grammar (for rt.constrain) of exactly one call of `name` (None: any of `tools`), its
    arguments held to the tool's parameter schema; the reply then ends (the model's eos is all the
    grammar allows)."""
    markup = _json_markup(response_template(rt)["fields"]["tool_calls"])
    if markup is None:
        raise InvalidInputError(
            "tool_choice 'required' or a named function holds the reply to a call written as JSON between two "
            "fixed markers (as <tool_call>{json}</tool_call>); this model writes calls in another format: use "
            "tool_choice 'auto'"
        )
    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    calls = [_call_schema(f) for f in chosen]
    schema = {"anyOf": calls} if len(calls) > 1 else calls[0]
    schema["x-guidance"] = {"whitespace_flexible": False}
    opening, closing = (json.dumps(text) for text in markup)
    return f'start: {opening} "\\n" call "\\n" {closing}\ncall: %json ' + json.dumps(schema)


_CALL_AS_JSON = {"type": "function", "function": "{content}"}  # the region's JSON is {"name", "arguments"}


def _json_markup(field: dict) -> tuple[str, str] | None:
    """(opening, closing) text of a call region whose body is the call as JSON between two fixed markers
    (a pattern's leading \\s* aside), as transformers' Qwen/Hermes template and its kin; else None."""
    if field.get("content") != "json" or field.get("content_args") or field.get("transform") != _CALL_AS_JSON:
        return None
    opening = field.get("open") or _literal(field.get("open_pattern", ""))
    closing = field.get("close") or _literal(field.get("close_pattern", ""))
    return (opening, closing) if isinstance(opening, str) and isinstance(closing, str) and opening else None


def _literal(pattern: str) -> str | None:
    """The fixed text a pattern matches (after a leading \\s*), or None if it matches more than one."""
    pattern = pattern.removeprefix(r"\s*")
    if not pattern or re.search(r"(?<!\\)[.^$*+?{}\[\]|()]|\\[a-zA-Z0-9]", pattern):
        return None
    return re.sub(r"\\(.)", r"\1", pattern)


def _call_schema(function: dict) -> dict:
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
