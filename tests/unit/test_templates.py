"""`aotpack export --chat-template FILE --response-template FILE` (exporter.templates): bad files are
refused at the edge, naming the file and the fault; a template that does not render is refused before
anything compiles; good ones land on what the bundle saves and a tool request can then be read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter import templates
from exporter.cli import main as aotpack
from runtime.errors import ExportError

TOOLS = Path(__file__).parents[1] / "slow" / "templates"


def test_a_template_that_does_not_parse_is_refused_with_its_line(tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}\n{{ m['content'] }\n{% endfor %}")
    with pytest.raises(ExportError, match=r"bad.jinja is not a Jinja template: line 2: .*; fix the file"):
        templates.read_chat(bad)
    with pytest.raises(ExportError, match=r"--chat-template .*missing.jinja cannot be read"):
        templates.read_chat(tmp_path / "missing.jinja")


@pytest.mark.parametrize(
    ("text", "message"),
    [("{not json", "not a transformers response template"), ('{"fields": {"c": {"content": "nope"}}}', "not a")],
)
def test_a_response_template_transformers_cannot_read_is_refused(tmp_path, text, message):
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(ExportError, match=message):
        templates.read_response(path)


def test_the_cli_refuses_a_bad_template_before_loading_anything(tmp_path, capsys):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% if %}")
    assert aotpack(["export", "no-such-model", "--out", str(tmp_path / "b"), "--chat-template", str(bad)]) != 0
    assert "bad.jinja is not a Jinja template" in capsys.readouterr().err


def test_a_template_that_fails_on_a_conversation_is_refused(checkpoint):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint("tiny-llama"))
    with pytest.raises(ExportError, match="does not render a system and a user message: .*no system turns"):
        templates.apply(tokenizer, "{{ raise_exception('no system turns') }}", None)


def test_good_templates_land_on_the_tokenizer_and_its_calls_can_be_read(checkpoint, tmp_path):
    """tiny-llama has no tool format of its own; with SmolLM2's tool template (ChatML tokens are plain
    text to its tokenizer) and a ChatML response template, a call in the reply is read back."""
    from transformers import AutoTokenizer

    from runtime.serve.toolstream import ReplyReader, folded

    tokenizer = AutoTokenizer.from_pretrained(checkpoint("tiny-llama"))
    chat = templates.read_chat(TOOLS / "smollm2-tools.jinja")
    response = templates.read_response(TOOLS / "chatml-tool-calls.json")
    templates.apply(tokenizer, chat, response)
    tokenizer.save_pretrained(tmp_path)
    saved = AutoTokenizer.from_pretrained(tmp_path)
    assert saved.chat_template == chat and saved.response_template == json.loads(response)
    prefix = saved.apply_chat_template(list(templates.SAMPLE), tools=[templates.TOOL], tokenize=False)
    assert '"name": "get_weather"' in prefix
    reply = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    ids = saved(reply, add_special_tokens=False)["input_ids"]
    message = folded(ReplyReader(saved, saved.response_template, prefix + "<|im_start|>assistant\n", []).finish(ids))
    assert message["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
