"""The chat and response templates a bundle carries over the checkpoint's: `aotpack export --chat-template
FILE --response-template FILE`, as llama-server's --chat-template-file and vLLM's --chat-template set them.

Why: a checkpoint's own template may not render tools (SmolLM2's and Gemma 3's do not), or may be wrong
for how the model was fine-tuned; a bundle is self-contained, so its template travels with it, hashed
and signed like the rest. A response template (transformers' declarative format for
`tokenizer.parse_response`) says how the model writes content, reasoning and tool calls, for models
transformers has no fallback for (runtime.serve.tools).

Owns: reading both files at the edge and refusing a template that does not parse, naming the file and
the line, before anything is loaded; checking that a chat template renders a conversation (with tools
when it takes them) on the checkpoint's tokenizer before anything compiles; and setting them on the
tokenizer or processor that the bundle saves.
"""

from __future__ import annotations

import json
from pathlib import Path

from runtime.errors import ExportError

SAMPLE = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the weather in Paris?"})
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "A city's weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def read_chat(path: Path | None) -> str | None:
    """The Jinja text of --chat-template, refused here if it does not parse."""
    if path is None:
        return None
    text = _read(path, "--chat-template")
    import jinja2.sandbox

    try:
        jinja2.sandbox.ImmutableSandboxedEnvironment().parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise ExportError(
            f"--chat-template {path} is not a Jinja template: line {e.lineno}: {e.message}; fix the file"
        ) from None
    return text


def read_response(path: Path | None) -> str | None:
    """The JSON text of --response-template, refused here unless transformers reads it as one."""
    if path is None:
        return None
    text = _read(path, "--response-template")
    from transformers.utils.chat_parsing.response_templates import load_response_template

    try:
        load_response_template(json.loads(text))
    except (ValueError, TypeError, KeyError) as e:
        raise ExportError(
            f"--response-template {path} is not a transformers response template ({e}); see "
            "transformers' chat parsing docs for its fields (content, reasoning_content, tool_calls)"
        ) from None
    return text


def _read(path: Path, flag: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ExportError(f"{flag} {path} cannot be read ({e.__class__.__name__}); give a UTF-8 text file") from None


def apply(preprocessor, chat: str | None, response: str | None) -> None:
    """Set the templates on what the bundle saves, once the chat template has rendered a conversation on
    the checkpoint's tokenizer (with a tool, if it takes tools)."""
    tokenizer = getattr(preprocessor, "tokenizer", preprocessor)
    if chat is not None:
        _renders(tokenizer, chat)
        tokenizer.chat_template = chat
        if preprocessor is not tokenizer:  # a processor renders its own copy (images and all)
            preprocessor.chat_template = chat
    if response is not None:
        tokenizer.response_template = json.loads(response)


def _renders(tokenizer, chat: str) -> None:
    tools = [TOOL] if "tools" in chat else None
    try:
        tokenizer.apply_chat_template(list(SAMPLE), chat_template=chat, tools=tools, add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 (a template's own raise_exception, or any error in its logic)
        raise ExportError(
            f"--chat-template does not render a system and a user message{' with a tool' if tools else ''}: "
            f"{type(e).__name__}: {e}; fix the template"
        ) from None
