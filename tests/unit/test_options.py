"""Options refused up front with what is wrong and the fix, before anything is loaded (seconds)."""

from __future__ import annotations

import pytest

from exporter.config import ExportConfig
from runtime.errors import BundleError, ExportError, InvalidInputError
from runtime.serve.config import ServeConfig


@pytest.mark.parametrize("key", ["clé-secrète", "tab\tkey", "emoji🙂"])
def test_an_api_key_no_client_could_send_is_refused(tmp_path, key):
    """It used to be accepted, and then no client could ever authenticate."""
    with pytest.raises(InvalidInputError, match="printable ASCII only"):
        ServeConfig(bundle=tmp_path, api_key=key)
    ServeConfig(bundle=tmp_path, api_key="sk-plain_ASCII.key~1")


def test_out_at_the_filesystems_root_is_named_as_such():
    """It said "None is not a writable directory"."""
    with pytest.raises(ExportError, match="--out / is the filesystem's root"):
        ExportConfig(model="tiny-llama", out="/")


def test_a_key_that_is_a_directory_is_not_reported_missing(tmp_path):
    pytest.importorskip("model_signing")
    from runtime.format.signing import SIGNATURE, sign, verify

    (tmp_path / SIGNATURE).write_text("{}")
    with pytest.raises(BundleError, match="is a directory, not a public-key file"):
        verify(tmp_path, [tmp_path])
    with pytest.raises(BundleError, match="is a directory, not a private-key file"):
        sign(tmp_path, tmp_path)


_HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("model", "fields", "field"),
    [
        ("chat", {"response_format": {"type": "json_object"}}, "response_format"),
        ("chat", {"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
        ("chat", {"logit_bias": {"42": 5}}, "logit_bias"),
        ("chat", {"frequency_penalty": 0.5}, "frequency_penalty"),
        ("chat", {"presence_penalty": -1.0}, "presence_penalty"),
        ("chat", {"tool_choice": "required"}, "tool_choice"),
        ("chat", {"top_logprobs": 3}, "top_logprobs"),
        ("text", {"echo": True}, "echo"),
        ("text", {"suffix": "tail"}, "suffix"),
        ("text", {"best_of": 3}, "best_of"),
    ],
)
def test_openai_fields_that_would_change_the_answer_are_refused_by_name(model, fields, field):
    """They used to be dropped silently: the client got an answer to another question."""
    from pydantic import ValidationError

    from runtime.serve.schema import ChatRequest, CompletionRequest

    schema, base = (ChatRequest, {"messages": _HI}) if model == "chat" else (CompletionRequest, {"prompt": "p"})
    with pytest.raises(ValidationError, match=field):
        schema(**base, **fields)


def test_the_no_op_values_of_those_fields_are_accepted():
    from runtime.serve.schema import ChatRequest, CompletionRequest

    ChatRequest(
        messages=_HI,
        response_format={"type": "text"},
        logit_bias={},
        frequency_penalty=0,
        presence_penalty=0.0,
        tool_choice="auto",
        top_logprobs=0,
    )
    CompletionRequest(prompt="p", echo=False, best_of=1, suffix="")


def test_max_queue_zero_with_ray_is_refused_before_loading(tmp_path, capsys):
    """0 meant "unbounded" under --ray and "never wait" without it; Ray's queue has no 0."""
    from runtime.cli import main

    assert main(["serve", str(tmp_path / "absent"), "--ray", "--max-queue", "0"]) == 2
    assert "--max-queue 0 (no request waits) has no Ray Serve equivalent" in capsys.readouterr().err


def test_stop_strings_are_bounded_in_number_and_length():
    """A 1-million-character stop string took 16 s and 2.7 GB to match; both bounds are the server's
    flags (--max-stops, --max-stop-chars)."""
    from runtime.serve.completion import check_stops

    check_stops(["a", "b"], max_stops=2, max_chars=1)
    check_stops(None, max_stops=0, max_chars=0)
    with pytest.raises(InvalidInputError, match="3 stop strings; this server takes at most 2"):
        check_stops(["a", "b", "c"], max_stops=2, max_chars=1)
    with pytest.raises(InvalidInputError, match="each stop string is at most 1 characters"):
        check_stops(["ab"], max_stops=2, max_chars=1)
