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
_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("model", "fields", "field"),
    [
        ("chat", {"tool_choice": "required"}, "tool_choice"),
        ("text", {"echo": True}, "echo"),
        ("text", {"suffix": "tail"}, "suffix"),
        ("text", {"best_of": 3}, "best_of"),
        ("chat", {"audio": {"voice": "alloy", "format": "wav"}}, "audio: aotpack serve replies in text only"),
        ("chat", {"modalities": ["text", "audio"]}, r"modalities \['text', 'audio'\]: aotpack serve replies in text"),
        ("chat", {"tools": [_TOOL], "parallel_tool_calls": False}, "parallel_tool_calls=false with tool_choice 'auto'"),
        ("text", {"min_tokens": 9, "max_tokens": 4}, "min_tokens=9 is more than the 4 tokens the request allows"),
        ("chat", {"min_tokens": 9, "max_completion_tokens": 4}, "min_tokens=9 is more than the 4 tokens"),
        ("chat", {"top_k": -2}, "greater than or equal to -1"),
        ("chat", {"repetition_penalty": 0}, "greater than 0"),
        ("chat", {"n": 0}, "n must be from 1 to 128, got 0"),
        ("chat", {"n": 129}, "n must be from 1 to 128, got 129"),
    ],
)
def test_openai_fields_that_would_change_the_answer_are_refused_by_name(model, fields, field):
    """They used to be dropped silently: the client got an answer to another question."""
    from pydantic import ValidationError

    from runtime.serve.schema import ChatRequest, CompletionRequest

    schema, base = (ChatRequest, {"messages": _HI}) if model == "chat" else (CompletionRequest, {"prompt": "p"})
    with pytest.raises(ValidationError, match=field):
        schema(**base, **fields)


def test_vllms_sampling_extensions_become_generate_options():
    """top_k (-1: off), min_p, repetition_penalty and min_tokens, under HF generate's names; top_k or min_p
    alone ask for sampling as temperature does; text-only modalities and one call by a named choice pass."""
    from types import SimpleNamespace

    from runtime.serve.completion import generate_options
    from runtime.serve.schema import ChatRequest

    rt = SimpleNamespace(
        contract=SimpleNamespace(max_cache_len=64, device="cpu"), validator=SimpleNamespace(vocab_size=9)
    )
    extended = {"top_k": -1, "min_p": 0.05, "repetition_penalty": 1.2, "min_tokens": 3, "modalities": ["text"]}
    sampled = generate_options(ChatRequest(messages=_HI, max_tokens=8, **extended), rt, 5)
    assert sampled == {
        "max_new_tokens": 8, "do_sample": True, "temperature": 1.0, "top_p": 1.0,
        "top_k": 0, "min_p": 0.05, "repetition_penalty": 1.2, "min_new_tokens": 3,
    }  # fmt: skip
    greedy = generate_options(ChatRequest(messages=_HI, temperature=0, top_k=5), rt, 5)
    assert greedy == {"max_new_tokens": 59, "do_sample": False, "top_k": 5}
    named = {"type": "function", "function": {"name": "f"}}
    ChatRequest(messages=_HI, tools=[_TOOL], tool_choice=named, parallel_tool_calls=False)


@pytest.mark.parametrize(
    ("model", "fields", "message"),
    [
        ("chat", {"top_logprobs": 3}, "top_logprobs=3 lists alternatives to logprobs: send logprobs=true too"),
        ("chat", {"logprobs": True, "top_logprobs": 21}, "less than or equal to 20"),
        ("text", {"logprobs": 21}, "less than or equal to 20"),
        ("chat", {"logit_bias": {"the": 5}}, "logit_bias keys are token ids, as strings of digits; got 'the'"),
        ("chat", {"logit_bias": {"42": 101}}, "logit_bias of token 42 is 101.0; biases go from -100 to 100"),
        ("chat", {"frequency_penalty": 2.5}, "less than or equal to 2"),
        (
            "chat",
            {"response_format": {"type": "xml"}},
            "response_format type 'xml' is not one of 'text', 'json_object'",
        ),
        ("chat", {"response_format": {"type": "json_schema", "json_schema": {}}}, 'needs {"json_schema": {"name"'),
        ("text", {"structured_outputs": {"yaml": "x"}}, "structured_outputs.yaml is not one of json, regex, choice"),
        (
            "chat",
            {"response_format": {"type": "json_object"}, "guided_regex": "a+"},
            "one output format per request, got 2: response_format, guided_regex",
        ),
        ("text", {"presence_penalty": -3}, "greater than or equal to -2"),
    ],
)
def test_logprobs_penalties_and_biases_are_range_checked(model, fields, message):
    from pydantic import ValidationError

    from runtime.serve.schema import ChatRequest, CompletionRequest

    schema, base = (ChatRequest, {"messages": _HI}) if model == "chat" else (CompletionRequest, {"prompt": "p"})
    with pytest.raises(ValidationError, match=message):
        schema(**base, **fields)


def test_the_legacy_completions_logprobs_integer_counts_alternatives():
    from runtime.serve.schema import ChatRequest, CompletionRequest

    assert CompletionRequest(prompt="p", logprobs=2).alternatives == 2  # not "a valid boolean"
    assert CompletionRequest(prompt="p").alternatives is None
    assert ChatRequest(messages=_HI, logprobs=True, top_logprobs=5).alternatives == 5
    assert ChatRequest(messages=_HI, logprobs=True).alternatives == 0
    assert ChatRequest(messages=_HI, logprobs=None).alternatives is None


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


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--prefill-chunk", "0", "--prefill-budget", "2"],
            "--prefill-budget 2 sizes prefill chunks, and --prefill-chunk",
        ),
        (["--prefill-budget", "-1"], "--prefill-budget must be a number of decode steps >= 0 (0: fixed chunks)"),
        (["--prefill-chunk", "-4"], "--prefill-chunk must be a number of tokens >= 0 (0: whole prompts), got -4"),
    ],
)
def test_serve_prefill_flags_are_refused_by_name_before_loading(tmp_path, capsys, flags, message):
    from runtime.cli import main

    assert main(["serve", str(tmp_path / "absent"), *flags]) == 2
    assert message in capsys.readouterr().err


def test_serve_prefill_flags_become_load_options():
    """0 turns each off; the budget applies only to chunks; without --prefill-budget, chunks get the default."""
    from runtime.cli import _prefill_options
    from runtime.serve.config import PREFILL_BUDGET

    assert _prefill_options(64, None) == {"prefill_chunk": 64, "prefill_budget": PREFILL_BUDGET}
    assert _prefill_options(64, 0) == {"prefill_chunk": 64, "prefill_budget": None}
    assert _prefill_options(0, None) == _prefill_options(0, 0) == {"prefill_chunk": None, "prefill_budget": None}
    assert _prefill_options(16, 2.5) == {"prefill_chunk": 16, "prefill_budget": 2.5}


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


def test_continue_final_message_needs_the_assistants_last_message_and_no_new_turn():
    from pydantic import ValidationError

    from runtime.serve.schema import ChatRequest

    partial = [*_HI, {"role": "assistant", "content": "Hello, I am"}]
    request = ChatRequest(messages=partial, continue_final_message=True, add_generation_prompt=False)
    assert request.continue_final_message and not request.add_generation_prompt
    with pytest.raises(ValidationError, match="send add_generation_prompt=false with continue_final_message=true"):
        ChatRequest(messages=partial, continue_final_message=True)
    with pytest.raises(ValidationError, match="the last message, which is the user's"):
        ChatRequest(messages=_HI, continue_final_message=True, add_generation_prompt=False)


def test_served_model_names_default_to_the_bundle_folder_and_are_checked(tmp_path):
    assert ServeConfig(bundle=tmp_path / "smol").names == ("smol",)
    config = ServeConfig(bundle=tmp_path / "smol", served_model_names=("smollm2", "gpt-4o-mini"))
    assert config.name == "smollm2" and config.names == ("smollm2", "gpt-4o-mini")
    with pytest.raises(InvalidInputError, match="--served-model-name '' must be a non-empty printable name"):
        ServeConfig(bundle=tmp_path, served_model_names=("",))


def test_each_way_of_asking_for_a_format_names_the_same_grammar_kinds():
    from runtime.serve.schema import ChatRequest, CompletionRequest

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    json_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    assert ChatRequest(messages=_HI, response_format=json_schema).output_format == ("json_schema", schema)
    assert ChatRequest(messages=_HI, response_format={"type": "json_object"}).output_format == ("json_schema", True)
    assert ChatRequest(messages=_HI, response_format={"type": "text"}).output_format is None
    assert CompletionRequest(prompt="p", structured_outputs={"regex": "[0-9]+"}).output_format == ("regex", "[0-9]+")
    assert CompletionRequest(prompt="p", guided_choice=["yes", "no"]).output_format == ("choice", ["yes", "no"])
    assert ChatRequest(messages=_HI, guided_json='{"type": "object"}').output_format == (
        "json_schema",
        {"type": "object"},
    )
    assert ChatRequest(messages=_HI, guided_grammar="start: /a+/").output_format == ("lark", "start: /a+/")


def test_tool_fields_are_checked_where_they_are_given():
    from pydantic import ValidationError

    from runtime.serve.schema import ChatRequest, CompletionRequest

    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    request = ChatRequest(
        messages=_HI, tools=[tool], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    assert request.tool_mode == "get_weather" and request.tool_dicts == [tool]
    assert ChatRequest(messages=_HI, tools=[tool]).tool_mode == "auto"
    assert ChatRequest(messages=_HI, tools=[tool], tool_choice="none").tool_mode is None
    with pytest.raises(ValidationError, match="the assistant message needs its content"):
        ChatRequest(messages=[{"role": "assistant", "content": None}])
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    ChatRequest(
        messages=[*_HI, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "content": "1"}]
    )
    with pytest.raises(ValidationError, match="String should match pattern"):
        ChatRequest(messages=_HI, tools=[{"type": "function", "function": {"name": "get weather"}}])
    with pytest.raises(ValidationError, match="tools is not supported by aotpack serve"):
        CompletionRequest(prompt="p", tools=[tool])
