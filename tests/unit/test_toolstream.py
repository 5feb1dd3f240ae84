"""Reading a tool request's reply as it streams (runtime.serve.toolstream), on tiny-qwen3's tokenizer and
transformers' response template for Qwen: token by token, the deltas fold to what transformers' own
parse_response reads in the whole reply, and a call's name and arguments go out as they are written."""

from __future__ import annotations

import json

import pytest

from runtime import compat
from runtime.serve.toolstream import ReplyReader, _object_length, folded

CALL = '{"name": "get_weather", "arguments": {"city": "Pa\\"ris }", "unit": "c", "n": [1, {"x": "]"}]}}'
REPLIES = {
    "content then a call": f"Let me check.\n<tool_call>\n{CALL}\n</tool_call><|im_end|>",
    "two calls": '<tool_call>\n{"arguments": {"x": 1}, "name": "f"}\n</tool_call>\n<tool_call>\n'
    '{"name": "g", "arguments": {}}\n</tool_call><|im_end|>',
    "text only": "  plain text,\n\n only  <|im_end|>",
    "reasoning": "<think>\nhmm\n</think>\n\nthe answer<|im_end|>",
}


@pytest.fixture(scope="module")
def qwen(checkpoint):
    from transformers import AutoConfig, AutoTokenizer

    folder = checkpoint("tiny-qwen3")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = type("Model", (), {"config": AutoConfig.from_pretrained(folder)})
    hello = [{"role": "user", "content": "hi"}]
    prefix = tokenizer.apply_chat_template(hello, tokenize=False, add_generation_prompt=True)
    return tokenizer, compat.response_template(tokenizer, model), prefix


def _streamed(qwen, text: str, stops: list[str] | None = None, reader: list | None = None) -> list[dict]:
    """The deltas of `text`'s tokens fed one at a time, as the engine makes them (`reader`: gets the reader)."""
    tokenizer, template, prefix = qwen
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    made = ReplyReader(tokenizer, template, prefix, [], stops)
    deltas = [delta for n in range(1, len(ids)) for delta in made.feed(ids[:n])]
    if reader is not None:
        reader.append(made)
    return deltas + made.finish(ids)


@pytest.mark.parametrize("name", REPLIES)
def test_streamed_deltas_fold_to_what_transformers_parses_in_the_whole_reply(qwen, name):
    tokenizer, template, prefix = qwen
    message = folded(_streamed(qwen, REPLIES[name]))
    parsed = tokenizer.parse_response(REPLIES[name], template, prefix=prefix)
    assert message.get("content") == parsed.get("content")
    assert message.get("reasoning_content") == parsed.get("reasoning_content")
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]
    assert calls == [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.get("tool_calls", [])]
    assert len({c["id"] for c in message.get("tool_calls", [])}) == len(calls)


def test_a_json_call_goes_out_as_it_is_written_and_its_markup_never_as_content(qwen):
    deltas = _streamed(qwen, REPLIES["content then a call"])
    parts = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert parts[0]["function"] == {"name": "get_weather", "arguments": ""} and parts[0]["id"].startswith("call_")
    assert len(parts) > 10 and all(set(p) == {"index", "function"} for p in parts[1:])  # piece by piece
    assert "".join(p["function"]["arguments"] for p in parts) == CALL[CALL.index('{"city"') : -1]  # as written
    assert "".join(d.get("content", "") for d in deltas) == "Let me check."


def test_a_call_cut_short_keeps_what_was_written_and_a_broken_one_is_text(qwen):
    cut = folded(_streamed(qwen, '<tool_call>\n{"name": "f", "arguments": {"city": "Pa'))
    assert cut["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"city": "Pa'}
    broken = folded(_streamed(qwen, "<tool_call>\nnot json\n</tool_call><|im_end|>"))
    assert broken == {"role": "assistant", "content": "not json"}


@pytest.mark.parametrize(
    ("text", "length"),
    [('{"a": "}"} tail', 10), ('{"a": [1, {"b": "\\"}"}]} x', 24), ('{"a": "open', 11), ("{}", 2)],
)
def test_object_length_skips_brackets_inside_strings(text, length):
    assert _object_length(text) == length


def test_constrained_calls_take_any_json_call_between_fixed_markers():
    """`required` and named choices build their grammar from the template's markers: transformers' Qwen
    template and a bundle's own of that kind; formats whose calls are not such JSON are left to `auto`."""
    from transformers.cli.serving.utils import _RESPONSE_TEMPLATE_FALLBACKS

    from runtime.serve.tools import _json_markup

    qwen, qwen35, gemma4 = (table["fields"]["tool_calls"] for table in _RESPONSE_TEMPLATE_FALLBACKS.values())
    assert _json_markup(qwen) == ("<tool_call>", "</tool_call>")
    assert _json_markup(qwen35) is None and _json_markup(gemma4) is None  # XML parameters; unquoted keys
    own = qwen | {"open_pattern": r"\s*<\|python_tag\|>", "close": "<|eom_id|>"}
    assert _json_markup(own) == ("<|python_tag|>", "<|eom_id|>")
    assert _json_markup(qwen | {"open_pattern": r"\s*<call\d>"}) is None  # more than one text opens it


def _whole(qwen, text: str, stops: list[str]) -> tuple[dict, bool]:
    """(the message, whether a call was read whole) of `text` read at once, as a non-streamed reply is."""
    tokenizer, template, prefix = qwen
    reader = ReplyReader(tokenizer, template, prefix, [], stops)
    return folded(reader.finish(tokenizer(text, add_special_tokens=False)["input_ids"])), reader.called


@pytest.mark.parametrize(
    ("stop", "content", "arguments", "called"),
    [
        ("check", "Let me", None, False),  # before the call: no call is read at all
        ('"unit"', "Let me check.", '{"city": "Pa\\"ris }", ', False),  # inside it: cut where the stop begins
        ("</tool_call>", "Let me check.", CALL[CALL.index('{"city"') : -1], True),  # its closing tag: read whole
    ],
)
def test_a_stop_string_cuts_the_text_before_the_parser_reads_it(qwen, stop, content, arguments, called):
    """What follows a stop string is never read, content or call; a call it cuts short is not complete
    (its choice finishes "stop"); streamed token by token, the same message."""
    text = REPLIES["content then a call"] + "\nObservation: sunny"
    readers: list = []
    streamed = folded(_streamed(qwen, text, [stop, "Observation:"], readers))
    whole, whole_called = _whole(qwen, text, [stop, "Observation:"])
    assert _ids_aside(streamed) == _ids_aside(whole)
    assert whole.get("content") == content and whole_called == called == readers[0].called
    calls = whole.get("tool_calls", [])
    assert [c["function"]["arguments"] for c in calls] == ([arguments] if arguments is not None else [])
    texts = [whole.get("content") or "", *(c["function"]["arguments"] for c in calls)]
    assert not any(stop in t or "sunny" in t for t in texts)


def _ids_aside(message: dict) -> dict:
    """The message with its calls' ids (random per reader) set aside."""
    return message | {"tool_calls": [c | {"id": None} for c in message.get("tool_calls", [])]}


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("Let me check. <tool_call>\nnot a call\n</tool_call><|im_end|>", "Let me check. not a call"),
        ('Let me <tool_call>\n{"name": "f", "argu<|im_end|>', 'Let me {"name": "f", "argu'),
        ('Let me\n<tool_call>\n{"name": "f" oops}\n</tool_call><|im_end|>', 'Let me\n{"name": "f" oops}'),
        ("<tool_call>\nnot a call\n</tool_call><|im_end|>", "not a call"),
        # the text before the failed call is found after the first call's body, where it also appears (text
        # regions around a call are joined as transformers joins them: "Aunit")
        (f"A\n<tool_call>\n{CALL}\n</tool_call>\nunit\n<tool_call>\nbad\n</tool_call><|im_end|>", "Aunit\nbad"),
        # the whitespace before a closed reasoning region is not the content's
        ("<think>\nR\n</think>\n\n<tool_call>\nbad\n</tool_call><|im_end|>", "bad"),
    ],
)
def test_a_call_that_does_not_parse_goes_out_as_text_after_the_whitespace_before_it(qwen, text, content):
    """transformers' parse_response raises on such a reply; served, what the model wrote stays text, kept
    apart from the text before it as written (it was glued on: "Let me{...") and without the end of turn
    that an unclosed call region runs into."""
    message = folded(_streamed(qwen, text))
    assert message["content"] == content and len(message.get("tool_calls", [])) == text.count(CALL)
