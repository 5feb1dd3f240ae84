"""`aotpack serve`, driven over HTTP on 127.0.0.1 with the official `openai` client.

Servers run in threads of this process over the session's shared runtimes (one compiled bundle each);
the SIGTERM test starts `python -m runtime serve` as a process of its own.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from urllib.parse import urlparse

import pytest
import torch
from helpers import JSON_SCHEMA as SCHEMA
from helpers import chat
from openai import APIStatusError, OpenAI

from runtime.backends.base import checked_each_call
from runtime.serve.config import ServeConfig
from runtime.serve.server import _Server, bind

pytestmark = pytest.mark.slow
TEXT, VLM = "tiny-llama", "tiny-gemma3-vlm"
QUESTION = [{"role": "user", "content": "Why is the sky blue?"}]
MODEL = "m"  # the name every test server is served under (--served-model-name)


@pytest.fixture(scope="module")
def serving(runtime, bundle):
    """serving(name, **config) -> (base URL, app), one server per distinct config, stopped at the end."""
    import uvicorn

    from runtime.serve.app import create_app

    servers, started = {}, []

    def start(name: str, rt=None, **options):
        """`rt`: a runtime of the preset's to serve instead of its bundle's (an eager one, say)."""
        options = {"served_model_names": (MODEL,)} | options
        key = (name, id(rt), tuple(sorted(options.items())))
        if key not in servers:
            rt = rt or runtime(name)
            config = ServeConfig(bundle=rt.path if rt.manifest is None else bundle(name), port=0, **options)
            sock = bind("127.0.0.1", 0)
            app = create_app(rt, config)
            server = _Server(uvicorn.Config(app, log_level="warning"), app)
            thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
            thread.start()
            while not server.started:
                time.sleep(0.01)
            started.append((server, thread))
            servers[key] = (f"http://127.0.0.1:{sock.getsockname()[1]}", app)
        return servers[key]

    yield start
    for server, thread in started:
        server.should_exit = True
        thread.join(timeout=30)


def fetch(method: str, url: str, body: dict | None = None):
    """(status, headers, text) of one plain HTTP request, error statuses included."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.headers, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


@contextmanager
def event_stream(url: str, body: dict):
    """A streaming POST; yields an iterator over its non-empty lines. Leaving closes the connection."""
    where = urlparse(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    reply = conn.getresponse()
    assert reply.status == 200
    try:
        yield (line.decode().strip() for line in reply if line.strip())
    finally:
        reply.close()  # the reply holds the socket open after conn.close() where the server said `close`
        conn.close()


def client(url: str, key: str = "unused") -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)


def _expected_text(rt, inputs: dict, **options) -> str:
    ids = rt.generate(**inputs, **options)
    return rt.tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def test_chat_equals_generate_with_and_without_streaming(serving, runtime):
    url, _ = serving(TEXT)
    rt = runtime(TEXT)
    expected = _expected_text(rt, chat(rt.tokenizer, [QUESTION]), max_new_tokens=20, do_sample=False)
    whole = client(url).chat.completions.create(model="m", messages=QUESTION, max_tokens=20, temperature=0)
    assert whole.choices[0].message.content == expected
    assert whole.usage.completion_tokens == 20 and whole.choices[0].finish_reason == "length"
    stream = client(url).chat.completions.create(
        model="m", messages=QUESTION, max_tokens=20, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens
    # the same prompt again: its row kept all of it but the last token, which the decode step takes
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens - 1


def test_completions_and_models(serving, runtime):
    url, app = serving(TEXT)
    rt = runtime(TEXT)
    expected = _expected_text(rt, dict(rt.tokenizer("once upon a time", return_tensors="pt")), max_new_tokens=10)
    reply = client(url).completions.create(model="m", prompt="once upon a time", max_tokens=10, temperature=0)
    assert reply.choices[0].text == expected
    assert [m.id for m in client(url).models.list().data] == [app.state.config.name]


def test_a_model_not_served_gets_vllms_404_and_each_alias_is_answered_as_itself(serving):
    url, _ = serving(TEXT)
    status, _, text = fetch("POST", f"{url}/v1/chat/completions", {"model": "gpt-4o", "messages": QUESTION})
    error = {"message": "The model `gpt-4o` does not exist.", "type": "NotFoundError", "param": "model", "code": 404}
    assert status == 404 and json.loads(text) == {"error": error}
    url, _ = serving(TEXT, served_model_names=("smollm2", "gpt-4o"))
    assert [m.id for m in client(url).models.list().data] == ["smollm2", "gpt-4o"]
    assert client(url).chat.completions.create(model="gpt-4o", messages=QUESTION, max_tokens=2).model == "gpt-4o"
    status, _, text = fetch("POST", f"{url}/v1/completions", {"prompt": "hi", "max_tokens": 2})  # no model: the first
    assert status == 200 and json.loads(text)["model"] == "smollm2"


def test_continue_final_message_goes_on_with_the_assistants_partial_reply(serving, runtime):
    """vLLM's extension, through the template as HF's apply_chat_template(continue_final_message=True)
    renders it: the prompt ends inside the assistant's message, no new turn is opened."""
    url, _ = serving(TEXT)
    rt = runtime(TEXT)
    partial = [*QUESTION, {"role": "assistant", "content": "Because the"}]
    template = {"continue_final_message": True, "add_generation_prompt": False}
    inputs = dict(
        rt.tokenizer.apply_chat_template(partial, tokenize=True, return_dict=True, return_tensors="pt", **template)
    )
    assert rt.tokenizer.decode(inputs["input_ids"][0]).endswith("Because the")
    expected = _expected_text(rt, inputs, max_new_tokens=8, do_sample=False)
    reply = client(url).chat.completions.create(
        model=MODEL, messages=partial, max_tokens=8, temperature=0, extra_body=template
    )
    assert reply.choices[0].message.content == expected
    assert reply.usage.prompt_tokens == inputs["input_ids"].shape[1]
    status, _, text = fetch("POST", f"{url}/v1/chat/completions", {"messages": partial, "continue_final_message": True})
    assert status == 400 and json.loads(text)["error"]["message"].startswith("continue_final_message continues")


def test_each_api_request_gets_one_log_line_when_it_has_ended(serving, caplog, monkeypatch):
    """A generation's line carries its tokens, finish reason and times; a refusal's its status; probes none."""
    from runtime.serve.access import LOG

    url, _ = serving(TEXT)
    monkeypatch.setattr(LOG, "propagate", True)  # to caplog's handler (aotpack serve's own turns it off)
    with caplog.at_level(logging.INFO, logger=LOG.name):
        client(url).chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=3, temperature=0)
        fetch("POST", f"{url}/v1/chat/completions", {"messages": QUESTION, "n": 200})
        fetch("GET", f"{url}/health")
    lines = [record.getMessage() for record in caplog.records if record.name == LOG.name]
    assert len(lines) == 2, lines
    served = dict(field.split("=", 1) for field in lines[0].split())
    assert served["method"] == "POST" and served["path"] == "/v1/chat/completions" and served["status"] == "200"
    assert served["completion_tokens"] == "3" and served["finish"] == "length" and served["id"].startswith("chatcmpl-")
    assert int(served["prompt_tokens"]) > 0 and 0 < float(served["ttft_s"]) <= float(served["s"])
    assert lines[1].startswith("method=POST path=/v1/chat/completions status=400")


def _expected_logprobs(rt, inputs: dict, new_tokens: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """generate's greedy tokens (n,) and the log_softmax of its raw logits at each step."""
    out = rt.generate(
        **inputs, max_new_tokens=new_tokens, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    return out.sequences[0, inputs["input_ids"].shape[1] :], [torch.log_softmax(s[0].float(), -1) for s in out.logits]


def test_chat_logprobs_equal_log_softmax_of_generates_logits_streaming_or_not(serving, runtime):
    url, _ = serving(TEXT)
    rt = runtime(TEXT)
    tokens, expected = _expected_logprobs(rt, chat(rt.tokenizer, [QUESTION]), 8)
    ask = {"model": MODEL, "messages": QUESTION, "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 5}
    content = client(url).chat.completions.create(**ask).choices[0].logprobs.content
    assert len(content) == 8
    for entry, token, logprobs in zip(content, tokens.tolist(), expected, strict=True):
        assert entry.token == rt.tokenizer.decode([token]) and abs(entry.logprob - logprobs[token].item()) < 1e-4
        values, ids = logprobs.topk(5)
        assert [alt.token for alt in entry.top_logprobs] == [rt.tokenizer.decode([i]) for i in ids.tolist()]
        assert all(abs(alt.logprob - v) < 1e-4 for alt, v in zip(entry.top_logprobs, values.tolist(), strict=True))
    chunks = client(url).chat.completions.create(**ask, stream=True)
    streamed = [e for c in chunks for e in (c.choices[0].logprobs.content if c.choices[0].logprobs else [])]
    # the same tokens; the logprobs within float rounding: the prefix cache kept the first request's
    # prompt, so this one's first logits come from the decode step rather than the prefill
    assert [e.token for e in streamed] == [e.token for e in content]
    assert all(abs(a.logprob - b.logprob) < 1e-4 for a, b in zip(streamed, content, strict=True))
    plain = client(url).chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)
    assert plain.choices[0].logprobs is None


def test_completions_logprobs_take_the_legacy_integer(serving, runtime):
    url, _ = serving(TEXT)
    rt = runtime(TEXT)
    tokens, expected = _expected_logprobs(rt, dict(rt.tokenizer("once upon a time", return_tensors="pt")), 6)
    reply = client(url).completions.create(
        model=MODEL, prompt="once upon a time", max_tokens=6, temperature=0, logprobs=3
    )
    lp = reply.choices[0].logprobs
    assert lp.tokens == [rt.tokenizer.decode([t]) for t in tokens.tolist()]
    assert all(
        abs(a - e[t].item()) < 1e-4 for a, e, t in zip(lp.token_logprobs, expected, tokens.tolist(), strict=True)
    )
    assert all(
        1 <= len(top) <= 3 and abs(max(top.values()) - e.max().item()) < 1e-4
        for top, e in zip(lp.top_logprobs, expected, strict=True)
    )
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(6)]


def test_sampled_logprobs_are_the_raw_logits_of_the_tokens_generate_samples(serving, runtime):
    """A seeded, sampled chat reply, streamed or not: generate's tokens for the same seed and temperature,
    each with log_softmax of its raw logits (before the temperature, as vLLM reports them)."""
    url, _ = serving(TEXT)
    rt = runtime(TEXT)
    out = rt.generate(
        **chat(rt.tokenizer, [QUESTION]), max_new_tokens=8, do_sample=True, temperature=0.7, top_p=1.0,
        generator=torch.Generator().manual_seed(5), output_logits=True, return_dict_in_generate=True,
    )  # fmt: skip
    tokens = out.sequences[0, -len(out.logits) :].tolist()
    expected = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.logits, tokens, strict=True)]
    ask = {"model": MODEL, "messages": QUESTION, "max_tokens": 8, "temperature": 0.7, "seed": 5, "logprobs": True}
    content = client(url).chat.completions.create(**ask).choices[0].logprobs.content
    chunks = client(url).chat.completions.create(**ask, stream=True)
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    for entries in (content, streamed):
        assert [e.token for e in entries] == [rt.tokenizer.decode([t]) for t in tokens]
        assert all(abs(e.logprob - v) < 1e-4 for e, v in zip(entries, expected, strict=True))


def test_streamed_completions_logprobs_are_the_replys_piece_by_piece(serving):
    """Legacy completions streamed with logprobs: the chunks' tokens, logprobs, alternatives and text
    offsets joined are the non-streamed reply's (offsets counted from the reply's start, not the chunk's)."""
    url, _ = serving(TEXT)
    ask = {"model": MODEL, "prompt": "once upon a time", "max_tokens": 6, "temperature": 0, "logprobs": 2}
    whole = client(url).completions.create(**ask).choices[0].logprobs
    pieces = [c.choices[0].logprobs for c in client(url).completions.create(**ask, stream=True) if c.choices]
    pieces = [p for p in pieces if p is not None and p.tokens]
    joined = {name: [v for p in pieces for v in getattr(p, name)] for name in ("tokens", "text_offset")}
    assert joined == {"tokens": whole.tokens, "text_offset": whole.text_offset}
    got = [v for p in pieces for v in p.token_logprobs]
    assert all(abs(a - b) < 1e-4 for a, b in zip(got, whole.token_logprobs, strict=True))
    tops = [t for p in pieces for t in p.top_logprobs]
    assert [sorted(t) for t in tops] == [sorted(t) for t in whole.top_logprobs]


def test_penalties_and_logit_bias_follow_openais_formulas_on_the_logits(serving, runtime, reference):
    """Greedy over HF's eager logits adjusted by OpenAI's formulas, written out here: each token's logit
    minus frequency x its count in the generated text, minus presence if it is there, plus its bias."""
    url, _ = serving(TEXT)
    rt, model = runtime(TEXT), reference(TEXT)
    ids = chat(rt.tokenizer, [QUESTION])["input_ids"]
    start, biased, eos = ids.shape[1], 57, set(rt.request(ids).eos_ids)  # the ids generate stops on
    with torch.inference_mode():
        for _ in range(12):
            logits = model(input_ids=ids).logits[0, -1].float()  # (vocab,)
            counts = torch.bincount(ids[0, start:], minlength=logits.shape[0]).float()
            logits = logits - 1.0 * counts - 0.5 * (counts > 0).float()
            logits[biased] += 4.0
            ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
            if int(ids[0, -1]) in eos:
                break
    expected = rt.tokenizer.decode(ids[0, start:], skip_special_tokens=True)
    ask = {"model": MODEL, "messages": QUESTION, "max_tokens": 12, "temperature": 0}
    adjusted = {"frequency_penalty": 1.0, "presence_penalty": 0.5, "logit_bias": {str(biased): 4.0}}
    assert client(url).chat.completions.create(**ask, **adjusted).choices[0].message.content == expected
    assert client(url).chat.completions.create(**ask).choices[0].message.content != expected  # they changed it


def test_vllms_sampling_extensions_give_generates_tokens(serving, runtime):
    """repetition_penalty and min_tokens on a greedy reply, top_k and min_p on a seeded one: the text
    `generate` gives for the same options (the penalty changes the greedy reply here)."""
    url, _ = serving(TEXT)
    rt = runtime(TEXT)
    inputs = chat(rt.tokenizer, [QUESTION])
    ask = {"model": MODEL, "messages": QUESTION, "max_tokens": 10}
    greedy = client(url).chat.completions.create(
        **ask, temperature=0, extra_body={"repetition_penalty": 1.8, "min_tokens": 10}
    )
    expected = _expected_text(rt, inputs, max_new_tokens=10, do_sample=False, repetition_penalty=1.8, min_new_tokens=10)
    assert (
        greedy.choices[0].message.content == expected != _expected_text(rt, inputs, max_new_tokens=10, do_sample=False)
    )
    cut = {"top_k": 5, "min_p": 0.05}
    sampled = client(url).chat.completions.create(**ask, seed=3, extra_body=cut)
    options = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 10, **cut}
    assert sampled.choices[0].message.content == _expected_text(
        rt, inputs, generator=torch.Generator().manual_seed(3), **options
    )


def test_fields_aotpack_does_not_build_are_refused_over_http_by_name(serving):
    """A 400 whose message names the field, through the official client, rather than an answer to another
    question: audio output, echo on completions, parallel_tool_calls=false with tool_choice auto."""
    url, _ = serving(TEXT)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    asks = [
        ("chat", {"messages": QUESTION, "extra_body": {"audio": {"voice": "alloy", "format": "wav"}}}, "audio"),
        ("chat", {"messages": QUESTION, "tools": [tool], "parallel_tool_calls": False}, "parallel_tool_calls"),
        ("text", {"prompt": "once", "echo": True}, "echo"),
        ("text", {"prompt": "once", "suffix": "end"}, "suffix"),
    ]
    for kind, fields, name in asks:
        create = client(url).chat.completions.create if kind == "chat" else client(url).completions.create
        with pytest.raises(APIStatusError) as e:
            create(model=MODEL, max_tokens=2, **fields)
        assert e.value.status_code == 400 and name in e.value.message, (name, e.value.message)


def test_json_schema_output_validates_20_of_20_streaming_and_20_of_20_not_beside_free_text(serving):
    """A random-weight model, sampled: held to the schema by llguidance's mask in its own rows while
    free-text requests decode in the same steps (4 rows, 48 requests at once). Half the constrained
    requests are seeded (HF's sampler over the masked vocabulary), half not (the server's top-k sampler,
    the mask applied before its top k are taken)."""
    import jsonschema

    url, _ = serving(TEXT)
    strict = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}
    ask = {"model": MODEL, "messages": QUESTION, "max_tokens": 48, "temperature": 1.0, "response_format": strict}

    def constrained(i: int) -> str:
        seed = {"seed": i} if i % 2 == 0 else {}
        if i < 20:
            return client(url).chat.completions.create(**ask, **seed).choices[0].message.content
        chunks = client(url).chat.completions.create(**ask, **seed, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    def free(i: int) -> str:
        return (
            client(url)
            .chat.completions.create(**(ask | {"response_format": None}), seed=100 + i)
            .choices[0]
            .message.content
        )

    with ThreadPoolExecutor(48) as pool:
        held, loose = [pool.submit(constrained, i) for i in range(40)], [pool.submit(free, i) for i in range(8)]
        replies, others = [f.result() for f in held], [f.result() for f in loose]
    for reply in replies:
        jsonschema.validate(json.loads(reply), SCHEMA)
    assert not any(other.startswith('{"color"') for other in others)


# Every other way a request names its format, with what its output must then be: each spec also opens
# the output to far more text than a random model would write by chance. All but json_object bound the
# output: "any object" does not, and a random model's string value runs past any budget, so a reply the
# budget cut must be a JSON object's beginning (json's own parser says where the text stopped making sense).
LARK = 'start: "go " DIR " " NUM\nDIR: "north" | "south"\nNUM: /[1-9][0-9]?/'
FORMATS = [  # (fields, the finish reason the text implies: a bounded format's is "stop")
    ({"response_format": {"type": "json_object"}}, lambda text: _object_or_its_start(text)),
    ({"structured_outputs": {"json": SCHEMA}}, lambda text: _stop(_valid(json.loads(text)))),
    ({"guided_json": json.dumps(SCHEMA)}, lambda text: _stop(_valid(json.loads(text)))),
    (
        {"structured_outputs": {"regex": "[a-c]{2}-[0-9]{3}"}},
        lambda text: _stop(re.fullmatch("[a-c]{2}-[0-9]{3}", text)),
    ),
    ({"guided_regex": "(yes|no), [0-9]+"}, lambda text: _stop(re.fullmatch("(yes|no), [0-9]+", text))),
    (
        {"structured_outputs": {"choice": ["red", "green", "blue"]}},
        lambda text: _stop(text in ("red", "green", "blue")),
    ),
    ({"guided_choice": ["alpha", "beta"]}, lambda text: _stop(text in ("alpha", "beta"))),
    ({"structured_outputs": {"grammar": LARK}}, lambda text: _stop(re.fullmatch("go (north|south) [1-9][0-9]?", text))),
    ({"guided_grammar": LARK}, lambda text: _stop(re.fullmatch("go (north|south) [1-9][0-9]?", text))),
]


def _stop(in_format) -> str:
    return "stop" if in_format else "(not in its format)"


def _object_or_its_start(text: str) -> str:
    """The finish reason `text` implies: stop for a JSON object, length for the start of one; else it fails."""
    try:
        assert isinstance(json.loads(text), dict), text
        return "stop"
    except json.JSONDecodeError as e:  # cut off: in a string still open, or right at the end
        assert text.startswith("{") and (e.pos == len(text) or e.msg == "Unterminated string starting at"), e
        return "length"


def _valid(value) -> bool:
    import jsonschema

    jsonschema.validate(value, SCHEMA)
    return True


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_every_format_field_holds_the_output_on_both_endpoints_streaming_or_not(serving, endpoint):
    """response_format json_object, vLLM's structured_outputs (json, regex, choice, grammar) and its
    guided_* fields, through the official client as extra fields: sampled replies of a random model, 3
    seeds each (one streamed), all at once, every one in its format and ended by the grammar (json_object,
    unbounded, may be cut by the budget)."""
    url, _ = serving(TEXT)
    openai = client(url)

    def ask(fields: dict, seed: int) -> tuple[str, str]:
        body = {"model": MODEL, "max_tokens": 64, "temperature": 1.0, "seed": seed, "extra_body": fields}
        if endpoint == "chat":
            create, body["messages"] = openai.chat.completions.create, QUESTION
            text = lambda c: c.message.content if seed != 2 else c.delta.content  # noqa: E731
        else:
            create, body["prompt"] = openai.completions.create, "once upon a time"
            text = lambda c: c.text  # noqa: E731
        if seed != 2:
            choice = create(**body).choices[0]
            return text(choice), choice.finish_reason
        chunks = [c.choices[0] for c in create(**body, stream=True) if c.choices]
        return "".join(text(c) or "" for c in chunks), chunks[-1].finish_reason

    with ThreadPoolExecutor(12) as pool:
        replies = [(pool.submit(ask, fields, seed), check) for fields, check in FORMATS for seed in range(3)]
        for future, check in replies:
            text, finish = future.result()
            assert finish == check(text), (text, finish)


def test_the_structured_bench_times_free_and_constrained_streams_on_a_running_server(serving):
    """`aotpack bench --serve --structured`'s measurement (exporter.bench.structured) against this server:
    both loads at 1 and 2 clients, every constrained reply opening the schema's object, no free one."""
    from exporter.bench.structured import CONSTRAINED, figures, measure

    url, _ = serving(TEXT)
    loads = measure(url, MODEL, streams=2, new_tokens=10, constrained=CONSTRAINED["aotpack serve"])
    assert set(loads) == {"free@1", "json@1", "free@2", "json@2"}
    for key, load in loads.items():
        assert load["clients"] == int(key[-1]) and load["chunks"] >= load["clients"] and load["tokens_per_s"] > 0
        assert load["itl_p50_ms"] > 0 and load["itl_p99_ms"] >= load["itl_p50_ms"]
    f = figures({"loads": loads}, streams=2)
    assert [f[n]["json_prefix"] for n in (1, 2)] == [1, 2]
    assert not any("".join(t.split()).startswith('{"story"') for n in (1, 2) for t in loads[f"free@{n}"]["texts"])


def test_the_prefix_cache_bench_times_first_tokens_under_a_shared_system_prompt(serving):
    """`aotpack bench --serve --prefix-cache`'s measurement (exporter.bench.prefix) against this server:
    the later requests report the shared system prompt as cached tokens."""
    from exporter.bench.config import BenchConfig
    from exporter.bench.prefix import LATER, measure

    url, _ = serving(TEXT)
    result = measure(url, MODEL, BenchConfig(dtypes=("float32",), serve=True, streams=2, long_prompt=30))
    assert result["first_s"] > 0 and len(result["later_s"]) == LATER and result["ratio"] > 0
    assert all(cached > 20 for cached in result["cached_tokens"][1:]), result["cached_tokens"]


def test_n_greedy_choices_are_one_decode_and_sampled_ones_are_hfs_sequences(serving, runtime):
    url, _ = serving(TEXT)
    rt = runtime(TEXT)
    inputs = chat(rt.tokenizer, [QUESTION])
    expected = _expected_text(rt, inputs, max_new_tokens=8, do_sample=False)
    greedy = client(url).chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0, n=3)
    assert [(c.index, c.message.content, c.finish_reason) for c in greedy.choices] == [
        (i, expected, "length") for i in range(3)
    ]
    assert greedy.usage.completion_tokens == 24
    # sampled: num_return_sequences rows, as generate samples them from the same seed
    sampling = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 8}
    rows = rt.generate(**inputs, **sampling, num_return_sequences=3, generator=torch.Generator().manual_seed(5))
    texts = [rt.tokenizer.decode(row[inputs["input_ids"].shape[1] :], skip_special_tokens=True) for row in rows]
    ask = {"model": MODEL, "messages": QUESTION, "max_tokens": 8, "temperature": 1.0, "n": 3, "seed": 5}
    sampled = client(url).chat.completions.create(**ask)
    assert [c.message.content for c in sampled.choices] == texts and len(set(texts)) > 1
    streamed = {i: "" for i in range(3)}
    for chunk in client(url).chat.completions.create(**ask, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert list(streamed.values()) == texts
    completions = client(url).completions.create(model=MODEL, prompt="once upon", max_tokens=4, temperature=0, n=2)
    assert [c.index for c in completions.choices] == [0, 1] and completions.choices[0].text == completions.choices[
        1
    ].text


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "A city's weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]


@pytest.fixture(scope="module")
def qwen(serving, eager_runtime):
    """aotpack serve over tiny-qwen3, whose template renders tools as Qwen's does, on the eager step:
    the tools' signatures take ~640 prompt tokens of its 384-token vocabulary, past the bundles' 160 slots."""
    return serving("tiny-qwen3", rt=eager_runtime("tiny-qwen3", rows=4, cache=1024))[0]


def _called(reply_or_chunks, stream: bool) -> tuple[list, str]:
    """(tool calls as (name, arguments), finish reason) of a whole reply or of a stream's chunks."""
    if not stream:
        choice = reply_or_chunks.choices[0]
        calls = choice.message.tool_calls or []
        return [(c.function.name, c.function.arguments) for c in calls], choice.finish_reason
    calls, finish = {}, None  # index -> [name, arguments], each joined from its deltas as OpenAI's clients do
    for chunk in reply_or_chunks:
        for choice in chunk.choices:
            for part in choice.delta.tool_calls or []:
                call = calls.setdefault(part.index, ["", ""])
                call[0] += part.function.name or ""
                call[1] += part.function.arguments or ""
            finish = choice.finish_reason or finish
    return [tuple(calls[i]) for i in sorted(calls)], finish


def test_required_and_named_tool_choices_give_calls_whose_arguments_validate_20_of_20(qwen):
    """A random-weight model, sampled: the grammar holds it to one call in Qwen's format, with
    arguments that follow the tool's parameter schema; transformers' parser reads the call back."""
    import jsonschema

    ask = {"model": MODEL, "messages": QUESTION, "tools": TOOLS, "temperature": 1.0, "max_tokens": 96}
    for i in range(20):
        named = i % 2 == 0
        choice = {"type": "function", "function": {"name": "get_weather"}} if named else "required"
        stream = i % 4 >= 2
        reply = client(qwen).chat.completions.create(**ask, seed=i, tool_choice=choice, stream=stream)
        calls, finish = _called(reply, stream)
        ((name, arguments),) = calls  # one call, streamed or not
        assert finish == "tool_calls" and (name == "get_weather" or not named), (name, arguments)
        jsonschema.validate(
            json.loads(arguments), WEATHER if name == "get_weather" else TOOLS[1]["function"]["parameters"]
        )


def test_a_streamed_call_arrives_as_it_is_written_and_matches_the_whole_reply(qwen):
    """The call's id and name first, then its arguments in pieces; joined, the same call as the same
    seeded request gives unstreamed; every token's logprob rides on the chunk that follows it."""
    ask = {"model": MODEL, "messages": QUESTION, "tools": TOOLS, "temperature": 1.0, "max_tokens": 96, "seed": 7}
    ask |= {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "logprobs": True}
    chunks = list(client(qwen).chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    parts = [part for chunk in chunks for c in chunk.choices for part in c.delta.tool_calls or []]
    assert parts[0].id.startswith("call_") and parts[0].function.name == "get_weather" and len(parts) > 3
    assert all(p.id is None and p.function.name is None for p in parts[1:])
    scored = [lp for chunk in chunks for c in chunk.choices if c.logprobs for lp in c.logprobs.content]
    assert len(scored) == chunks[-1].usage.completion_tokens
    whole = client(qwen).chat.completions.create(**ask)
    assert _called(chunks, True) == _called(whole, False) and len(whole.choices[0].logprobs.content) == len(scored)


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_inside_a_call_cuts_it_and_one_after_it_keeps_it(qwen, stream):
    """The named call's arguments follow the schema, "city" then "unit". A stop at '"unit"' cuts the
    call there: its arguments end before the stop, nothing after is read, and the choice finishes "stop"
    (the call is not whole). A stop at its closing tag leaves the call whole: "tool_calls", arguments
    that parse."""
    ask = {"model": MODEL, "messages": QUESTION, "tools": TOOLS, "temperature": 1.0, "max_tokens": 96, "seed": 3}
    ask |= {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "stream": stream}
    calls, finish = _called(client(qwen).chat.completions.create(**ask, stop=['"unit"']), stream)
    ((name, arguments),) = calls
    assert name == "get_weather" and finish == "stop" and '"unit"' not in arguments
    assert arguments.startswith('{"city"') and arguments.rstrip().endswith(",")
    calls, finish = _called(client(qwen).chat.completions.create(**ask, stop=["</tool_call>"]), stream)
    ((name, arguments),) = calls
    assert finish == "tool_calls" and set(json.loads(arguments)) == {"city", "unit"}


def test_auto_tool_choice_shows_what_the_model_does_and_none_gives_text(qwen):
    ask = {"model": MODEL, "messages": QUESTION, "tools": TOOLS, "max_tokens": 16, "temperature": 0}
    auto = client(qwen).chat.completions.create(**ask)  # a random model writes no call: text, finish length
    assert auto.choices[0].message.tool_calls is None and auto.choices[0].finish_reason in ("length", "stop")
    assert client(qwen).chat.completions.create(**ask, tool_choice="none").choices[0].message.content is not None


def test_a_tool_call_and_its_result_go_back_through_the_template(qwen, eager_runtime):
    """A conversation holding an assistant's call (arguments as OpenAI's JSON string) and the tool's
    result: the prompt is the template's rendering of them (the arguments as JSON, not a quoted string)."""
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'},
    }
    messages = [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    reply = client(qwen).chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=4, temperature=0
    )
    rt = eager_runtime("tiny-qwen3", rows=4, cache=1024)
    rendered = [
        *QUESTION,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{**call, "function": {**call["function"], "arguments": {"city": "Paris", "unit": "c"}}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    ids = rt.tokenizer.apply_chat_template(
        rendered, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    assert reply.usage.prompt_tokens == len(ids)
    assert '"arguments": {"city": "Paris", "unit": "c"}' in rt.tokenizer.decode(ids)


def test_tools_on_a_bundle_whose_template_has_none_are_refused(serving):
    url, _ = serving(TEXT)
    status, _, text = fetch("POST", f"{url}/v1/chat/completions", {"messages": QUESTION, "tools": TOOLS})
    assert status == 400 and "chat template does not render tools" in json.loads(text)["error"]["message"]
    status, _, text = fetch(
        "POST",
        f"{url}/v1/chat/completions",
        {"messages": QUESTION, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
    )
    assert status == 400 and "names no tool of this request" in json.loads(text)["error"]["message"]


def test_stop_cuts_where_the_stop_string_begins(serving):
    url, _ = serving(TEXT)
    ask = lambda **kw: client(url).chat.completions.create(model="m", messages=QUESTION, temperature=0, **kw)  # noqa: E731
    free = ask(max_tokens=30).choices[0].message.content
    stop = free[8:11]
    assert stop.strip() and free.index(stop) >= 0
    cut = ask(max_tokens=30, stop=[stop])
    assert cut.choices[0].message.content == free[: free.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible_and_equals_generate(serving, runtime):
    url, _ = serving(TEXT)
    rt = runtime(TEXT)

    def ask(seed):
        options = {"max_tokens": 16, "temperature": 0.9, "top_p": 0.95, "seed": seed}
        return client(url).chat.completions.create(model="m", messages=QUESTION, **options).choices[0].message.content

    first, again, other = ask(5), ask(5), ask(6)
    assert first == again and first != other
    generator = torch.Generator().manual_seed(5)
    inputs = chat(rt.tokenizer, [QUESTION])
    expected = _expected_text(
        rt, inputs, max_new_tokens=16, do_sample=True, temperature=0.9, top_p=0.95, generator=generator
    )
    assert first == expected


def _data_url(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_an_image_message_to_the_vlm(serving, runtime):
    from PIL import Image

    url, _ = serving(VLM)
    rt = runtime(VLM)
    image = Image.new("RGB", (40, 30), (200, 30, 60))
    content = [{"type": "image_url", "image_url": {"url": _data_url(image)}}, {"type": "text", "text": "What is it?"}]
    reply = client(url).chat.completions.create(
        model="m", messages=[{"role": "user", "content": content}], max_tokens=12, temperature=0
    )
    local = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "What is it?"}]}]
    assert reply.choices[0].message.content == _expected_text(rt, chat(rt, [local]), max_new_tokens=12, do_sample=False)
    assert reply.usage.prompt_tokens > 4  # the image's soft tokens are in the prompt


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"max_tokens": 10_000}, "max_cache_len"),
        ({"temperature": 7}, "temperature"),
        ({"n": 0}, "n must be from 1 to 128"),
        ({"n": 5, "temperature": 1.0}, "n=5 sampled choices decode in 5 cache rows at once; this bundle has 4"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}
                ]
            },
            "text-only",
        ),
    ],
)
def test_invalid_requests_get_400_with_aotpacks_message(serving, body, message):
    url, _ = serving(TEXT)
    with pytest.raises(APIStatusError) as e:
        client(url).chat.completions.create(**({"model": "m", "messages": QUESTION} | body))
    assert e.value.status_code == 400 and message in e.value.message


def test_a_distribution_that_overflows_is_a_400_streaming_or_not(serving):
    """temperature 1e-300 turns the scores into inf: an OpenAI-shaped error, and a stream that says it
    in-band and still ends with [DONE] (it used to be a plain-text 500, and a silent empty stream)."""
    url, _ = serving(TEXT)
    body = {"model": "m", "messages": QUESTION, "temperature": 1e-300, "max_tokens": 4}
    status, _, text = fetch("POST", f"{url}/v1/chat/completions", body)
    assert status == 400 and "NaN or inf" in json.loads(text)["error"]["message"]
    with event_stream(url, body | {"stream": True}) as lines:
        events = list(lines)
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["type"] == "invalid_request_error" and "temperature" in error["message"]


def test_images_over_the_pixel_limit_and_bad_data_are_refused(serving):
    from PIL import Image

    url, _ = serving(VLM, max_image_pixels=100 * 100)
    for image_url, message in (
        (_data_url(Image.new("RGB", (200, 200))), "exceeds this server's limit"),
        ("data:image/png;base64,not-base64!", "invalid base64"),
        ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "not a readable image"),
    ):
        content = [{"type": "image_url", "image_url": {"url": image_url}}, {"type": "text", "text": "hi"}]
        with pytest.raises(APIStatusError) as e:
            client(url).chat.completions.create(model="m", messages=[{"role": "user", "content": content}])
        assert e.value.status_code == 400 and message in e.value.message


def test_a_requests_images_are_budgeted_together_before_any_is_decoded(serving, monkeypatch):
    """Each image under the per-image limit, but too many of them, or too many pixels together: refused
    from the headers alone (16 one-bit 4096x4096 PNGs in a 45 KiB body took 0.9 GiB to decode)."""
    from PIL import Image

    import runtime.serve.messages as messages

    url, _ = serving(VLM, max_image_pixels=100 * 100, max_request_pixels=25_000, max_images=3)
    decoded = []
    monkeypatch.setattr(messages, "decode_image", lambda *a: decoded.append(a))
    small, large = _data_url(Image.new("1", (10, 10))), _data_url(Image.new("1", (100, 100)))

    def refusal(content) -> str:
        body = {"messages": [{"role": "user", "content": content}]}
        status, _, text = fetch("POST", f"{url}/v1/chat/completions", body)
        assert status == 400
        return json.loads(text)["error"]["message"]

    def images(*urls):
        return [{"type": "image_url", "image_url": {"url": u}} for u in urls] + [{"type": "text", "text": "hi"}]

    assert "4 images in one request; this server takes at most 3" in refusal(images(small, small, small, small))
    assert "hold 30000 pixels together, over this server's limit of 25000" in refusal(images(large, large, large))
    assert "needs its image_url field" in refusal([{"type": "image_url"}])  # was an AttributeError and a 500
    assert decoded == []  # nothing was decoded for any of them


def test_a_stop_string_over_the_limit_is_refused(serving):
    """A 1-million-character stop string took peak memory from 1.0 to 3.7 GiB and 16 s."""
    url, _ = serving(TEXT, max_stop_chars=50)
    with pytest.raises(APIStatusError) as e:
        client(url).chat.completions.create(model="m", messages=QUESTION, stop=["x" * 51], max_tokens=2)
    assert e.value.status_code == 400 and "each stop string is at most 50 characters" in e.value.message


def test_a_chunked_body_over_the_limit_gets_413_from_the_bytes_read(serving):
    """No Content-Length to check up front: a 300 MB chunked body used to be read whole and answered 200."""
    url, _ = serving(TEXT, max_body_bytes=1000)
    where = urlparse(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
    body = json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}).encode()
    chunks = (body[i : i + 512] for i in range(0, len(body), 512))
    conn.request("POST", "/v1/chat/completions", chunks, {"Content-Type": "application/json"}, encode_chunked=True)
    reply = conn.getresponse()
    assert reply.status == 413 and "error" in json.loads(reply.read())
    conn.close()


@pytest.mark.parametrize(
    "data",
    [b"[" * 100_000 + b"]" * 100_000, b'{"max_tokens": ' + b"9" * 5000 + b"}", b'{"messages": "\xff\xfe"}' + b"\xff"],
)
def test_bodies_that_cannot_be_parsed_get_openais_error_shape(serving, data):
    url, _ = serving(TEXT)
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=60)
    assert e.value.code in (400, 422) and set(json.loads(e.value.read())) == {"error"}


def test_body_over_the_limit_gets_413(serving):
    url, _ = serving(TEXT, max_body_bytes=1000)
    status, _, text = fetch(
        "POST", f"{url}/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 2000}]}
    )
    assert status == 413 and "limit" in json.loads(text)["error"]["message"]


def test_a_wrong_or_missing_key_gets_401(serving):
    url, _ = serving(TEXT, api_key="sesame")
    for key in ("wrong", ""):
        with pytest.raises(APIStatusError) as e:
            client(url, key or "x").chat.completions.create(model="m", messages=QUESTION, max_tokens=2)
        assert e.value.status_code == 401
    assert client(url, "sesame").chat.completions.create(model="m", messages=QUESTION, max_tokens=2).choices
    assert fetch("GET", f"{url}/health")[0] == 200  # probes need no key


class _SlowDecode:
    """The compiled decode 20 ms slower a call, counting its calls; its other attributes (the batches
    the engine covers) pass through."""

    def __init__(self, decode):
        self.decode, self.calls = decode, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        time.sleep(0.02)
        return self.decode(*args, **kwargs)

    def bind(self, *tensors):  # every step through __call__
        return checked_each_call(self, *tensors)

    def __getattr__(self, name):
        return getattr(self.decode, name)


@pytest.fixture
def slow_steps(runtime, monkeypatch):
    """Each compiled step of the shared text runtime's engine takes 20 ms more, so requests stay in
    flight; `rt.engine.runner.decode.calls` counts the steps."""
    rt = runtime(TEXT)
    runner = rt.engine.runner
    monkeypatch.setattr(runner, "decode", _SlowDecode(runner.decode))
    yield rt
    monkeypatch.undo()
    _wait(lambda: rt.engine.load == (0, 0))


def _wait(condition, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_a_full_queue_gets_429_with_retry_after(serving, slow_steps):
    rt = slow_steps
    url, _ = serving(TEXT, max_queue=1)
    ids = torch.tensor([[5, 6, 7]])
    hog = rt.submit(ids.repeat(rt.manifest.batch_size, 1), max_new_tokens=100)  # every row
    waiting = rt.submit(ids, max_new_tokens=2)
    _wait(lambda: rt.engine.load == (1, 1))
    status, headers, text = fetch("POST", f"{url}/v1/chat/completions", {"messages": QUESTION, "max_tokens": 2})
    assert status == 429 and headers["retry-after"] == "1"
    assert "already waiting" in json.loads(text)["error"]["message"]
    hog.cancel()
    waiting.result()


def test_a_client_that_disconnects_mid_stream_frees_its_rows(serving, slow_steps):
    rt = slow_steps
    url, _ = serving(TEXT)
    body = {"messages": QUESTION, "max_tokens": 120, "stream": True}
    with event_stream(url, body) as lines:
        assert next(lines).startswith("data: ")
        _wait(lambda: rt.engine.rows_in_use == 1)
    # the connection is closed here, long before 120 tokens at 20 ms each
    _wait(lambda: rt.engine.rows_in_use == 0 and rt.engine.load == (0, 0))
    assert rt.engine.runner.decode.calls < 60, "the stream went on generating after its client left"
    assert "aotpack_slots_in_use 0.0" in fetch("GET", f"{url}/metrics")[2]


def test_a_client_that_hangs_up_on_a_whole_reply_frees_its_rows(serving, slow_steps):
    """Not streaming: 8 clients that hung up used to keep every row generating for nobody. The steps are
    counted, not timed (a loaded machine slows them all): the reply left alone would take all 120. Behind
    the guard middleware Starlette's `is_disconnected()` never saw the hang-up, and this test, timed and
    with steps not slowed, passed on the reply's natural end."""
    rt = slow_steps
    url, _ = serving(TEXT)
    where = urlparse(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
    body = {"messages": QUESTION, "max_tokens": 120}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    _wait(lambda: rt.engine.rows_in_use == 1)
    conn.close()  # before 120 tokens at 20 ms each
    _wait(lambda: rt.engine.rows_in_use == 0 and rt.engine.load == (0, 0))
    steps = rt.engine.runner.decode.calls
    assert steps < 60, f"the reply went on for {steps} of its 120 steps after its client hung up"


def test_a_shared_system_prompt_is_reported_as_cached_tokens_and_counted(serving, runtime):
    """The second request's prompt starts as the first's did: it prefills only the rest, says how many
    tokens it skipped in usage.prompt_tokens_details.cached_tokens, and /metrics counts the hit."""
    url, _ = serving(TEXT)
    system = {"role": "system", "content": "You are a careful assistant who answers in one short sentence."}
    turns = [[system, {"role": "user", "content": question}] for question in ("Why is grass green?", "Hi!")]
    first, second = (
        client(url).chat.completions.create(model=MODEL, messages=t, max_tokens=3, temperature=0) for t in turns
    )
    template = runtime(TEXT).tokenizer.apply_chat_template
    rendered = [template(t, add_generation_prompt=True, return_dict=True)["input_ids"] for t in turns]
    shared = next(i for i, (a, b) in enumerate(zip(*rendered, strict=False)) if a != b)
    assert second.usage.prompt_tokens_details.cached_tokens == shared > 10
    assert second.usage.prompt_tokens == len(rendered[1])
    metrics = fetch("GET", f"{url}/metrics")[2]
    assert "aotpack_prefix_cache_hits_total" in metrics and "aotpack_prefix_cache_tokens_total" in metrics


def test_health_readiness_and_metrics(serving):
    url, _ = serving(TEXT)
    client(url).chat.completions.create(model="m", messages=QUESTION, max_tokens=3)
    assert json.loads(fetch("GET", f"{url}/health")[2]) == {"status": "ok"}
    assert json.loads(fetch("GET", f"{url}/ready")[2])["status"] == "ready"
    metrics = fetch("GET", f"{url}/metrics")[2]
    for name in (
        'aotpack_requests_total{endpoint="/v1/chat/completions",status="200"}',
        "aotpack_generated_tokens_total",
        "aotpack_queue_depth",
        "aotpack_slots 4.0",
        "aotpack_time_to_first_token_seconds_count",
        "aotpack_inter_token_latency_seconds_bucket",
        "aotpack_spec_drafted_tokens_total 0.0",  # this bundle has no verify graphs: nothing drafted
        "aotpack_spec_verify_steps_total 0.0",
    ):
        assert name in metrics


def test_prompt_lookup_num_tokens_is_taken_and_range_checked(serving):
    """The extension field reaches generate (a bundle without verify graphs decodes as before: the same
    reply); a negative count is a 400 naming it."""
    url, _ = serving(TEXT)
    plain = client(url).chat.completions.create(model="m", messages=QUESTION, max_tokens=6, temperature=0)
    asked = client(url).chat.completions.create(
        model="m", messages=QUESTION, max_tokens=6, temperature=0, extra_body={"prompt_lookup_num_tokens": 3}
    )
    assert asked.choices[0].message.content == plain.choices[0].message.content
    with pytest.raises(APIStatusError, match="prompt_lookup_num_tokens"):
        client(url).chat.completions.create(
            model="m", messages=QUESTION, max_tokens=2, extra_body={"prompt_lookup_num_tokens": -1}
        )


def test_load_16_clients_64_requests_nothing_lost_all_equal_generate(serving, runtime):
    """Bounded: 64 requests of 24 tokens from 16 threads; every reply equals `generate` of its prompt."""

    url, _ = serving(TEXT)
    rt = runtime(TEXT)
    questions = [[{"role": "user", "content": f"Question number {i}: why?"}] for i in range(8)]
    expected = [_expected_text(rt, chat(rt.tokenizer, [q]), max_new_tokens=24, do_sample=False) for q in questions]

    def ask(i: int):
        start = time.perf_counter()
        reply = client(url).chat.completions.create(model="m", messages=questions[i % 8], max_tokens=24, temperature=0)
        return i, reply.choices[0].message.content, time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(ask, range(64)))
    wall = time.perf_counter() - start
    assert len(results) == 64
    assert all(text == expected[i % 8] for i, text, _ in results)
    latencies = sorted(t for _, _, t in results)
    figures = {"requests": 64, "clients": 16, "wall_s": wall, "tokens_per_s": 64 * 24 / wall,
               "latency_p50_s": latencies[32], "latency_p99_s": latencies[63]}  # fmt: skip
    print("\nload test:", json.dumps(figures))


def test_sigterm_finishes_what_is_in_flight_and_exits(bundle):
    """A separate `python -m runtime serve` process: SIGTERM while a stream runs; the stream ends
    normally (within the grace period) and the process exits by the signal, without a traceback.
    It decodes on ONNX Runtime (`--backend onnxruntime`): the in-process servers cover the .so."""
    path = bundle(TEXT)
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime", "serve", str(path), "--port", "0", "--shutdown-grace", "20",
         "--backend", "onnxruntime"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert "4 slots, onnxruntime decode) on" in line, proc.stderr.read() if not line else line
        assert "signature NOT checked (no --key)" in line  # a bundle served without a key says so
        url = line.split(" on ")[1].split(",")[0]
        body = {"messages": QUESTION, "max_tokens": 60, "stream": True}
        with event_stream(url, body) as lines:
            next(lines)
            proc.send_signal(signal.SIGTERM)
            rest = list(lines)
        assert rest[-1] == "data: [DONE]", rest[-3:]
        # uvicorn re-raises the signal once it has shut down, so the exit status is the signal's (143 in a shell)
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
        log = proc.stderr.read()
        assert "Traceback" not in log
        # the server's log: the signal, the request's line once its stream ended, the stop
        said = [line.split("aotpack serve: ", 1)[1] for line in log.splitlines() if "aotpack serve: " in line]
        signalled = re.match(
            r"SIGTERM: admitting no more requests; (\d+) running and (\d+) waiting get up to 20 s", said[0]
        )
        assert signalled and int(signalled[1]) + int(signalled[2]) == 1, said
        assert any(
            line.startswith("method=POST path=/v1/chat/completions status=200 client=127.0.0.1 id=chatcmpl-")
            and "completion_tokens=" in line
            and " finish=" in line
            and " ttft_s=" in line
            for line in said
        ), said
        assert said[-1] == "stopped: 1 API request(s) answered"
    finally:
        proc.kill()  # a no-op once it has exited; reaped either way, nothing left listening
        proc.wait(timeout=60)
