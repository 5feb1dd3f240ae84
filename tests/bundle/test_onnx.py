"""The ONNX decode (`export --onnx`, `load(..., backend="onnxruntime")`): the same step as an ONNX graph
run by ONNX Runtime, token-identical to HF eager generate, over the eager model's weights.

The shared bundles carry decode.onnx (conftest's default options), so every family here is the same
bundle the AOTInductor tests load, decoded by the other backend.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from helpers import (
    GREEDY,
    SAMPLED,
    assert_each_matches_lone_generate,
    assert_parity,
    chat,
    prefilled_step,
    staggered,
    submitter,
)
from test_parity import CONVERSATIONS, TEXT_FAMILIES
from test_vlm import CASES, NEW_TOKENS, VLM

from exporter.cli import main as aotpack
from runtime import load
from runtime.errors import BundleError, IncompatibleBundleError, IntegrityError, InvalidInputError
from runtime.format.files import DECODE_ONNX, MANIFEST, WEIGHTS
from runtime.format.manifest import _digest


@pytest.mark.parametrize("name", TEXT_FAMILIES)
def test_chat_batch_left_padded_matches_hf(name, onnx_runtime, reference):
    rt = onnx_runtime(name)
    inputs = chat(rt.tokenizer, CONVERSATIONS)
    assert (inputs["attention_mask"] == 0).any()
    assert_parity(rt, reference(name), inputs, new_tokens=48)


@pytest.mark.parametrize("prompt_len", [5, 13])
def test_gemma3_text_far_past_the_window(prompt_len, onnx_runtime, reference):
    rt = onnx_runtime("tiny-gemma3")
    window = next(layer.window for layer in rt.manifest.cache_layout if layer.window)
    ids = torch.arange(3, 3 + prompt_len)[None]  # (1, S)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    assert_parity(rt, reference("tiny-gemma3"), inputs, new_tokens=6 * window)


@pytest.mark.parametrize("case", ["one_image", "two_images", "second_turn"])
def test_vlm_with_images_matches_hf(case, onnx_runtime, reference):
    """The eager prefill runs the vision tower; decode.onnx holds the text decoder only."""
    rt = onnx_runtime(VLM)
    assert_parity(rt, reference(VLM), chat(rt, [CASES[case]]), NEW_TOKENS, logit_steps=8)


def test_vlm_batch_with_images_left_padded(onnx_runtime, reference):
    rt = onnx_runtime(VLM)
    inputs = chat(rt, [CASES["one_image"], CASES["second_turn"]])
    assert (inputs["attention_mask"] == 0).any()
    assert_parity(rt, reference(VLM), inputs, NEW_TOKENS, logit_steps=8)


def test_concurrent_requests_each_match_a_lone_generate(onnx_runtime, reference):
    """Continuous batching through ONNX Runtime: rows at different positions, sampled and greedy."""
    rt = onnx_runtime("tiny-gemma3")
    torch.manual_seed(3)
    prompts = [{"input_ids": torch.randint(3, 300, (1, n))} for n in (9, 23, 4, 40, 15)]
    plan = [(p, SAMPLED if i % 2 else GREEDY, 50 + i if i % 2 else None) for i, p in enumerate(prompts)]
    assert_each_matches_lone_generate(reference("tiny-gemma3"), plan, staggered(submitter(rt), plan))
    assert rt.engine.peak_running >= 2


def test_the_export_gate_checked_the_onnx_decode(bundle):
    manifest = load(bundle("tiny-llama"), backend="onnxruntime").manifest
    parity = manifest.onnx.parity
    assert parity.steps > 0 and parity.tokens_match and parity.max_abs_logit_diff <= parity.tolerance
    assert manifest.onnx.onnxruntime_version == onnxruntime.__version__
    assert DECODE_ONNX in manifest.files


def test_decode_onnx_keeps_its_weights_in_model_safetensors(bundle):
    """No second copy on disk: every weight initializer is external data inside model.safetensors."""
    path = bundle("tiny-gemma3")
    graph = onnx.load(str(path / DECODE_ONNX), load_external_data=False).graph
    external = {t.name: {e.key: e.value for e in t.external_data} for t in graph.initializer if t.external_data}
    manifest = json.loads((path / MANIFEST).read_text())["onnx"]
    assert set(external) == {w["name"] for w in manifest["initializers"]}
    assert {e["location"] for e in external.values()} == {WEIGHTS}
    assert sum(int(e["length"]) for e in external.values()) > 0.9 * (path / WEIGHTS).stat().st_size
    assert (path / DECODE_ONNX).stat().st_size < 0.5 * (path / WEIGHTS).stat().st_size


@torch.inference_mode()
def test_decode_onnx_runs_in_plain_onnxruntime(onnx_runtime):
    """decode.onnx alone, in an ONNX Runtime session that knows nothing of aotpack (weights read from the
    bundle's safetensors), computes the runtime's logits: the portable artifact is self-contained."""
    rt = onnx_runtime("tiny-llama")
    ids = torch.tensor([[5, 9, 30, 41, 7]])
    token, position, cache_position, pad_mask, kv = _prefilled(rt, ids)
    session = onnxruntime.InferenceSession(str(rt.path / DECODE_ONNX), providers=["CPUExecutionProvider"])
    inputs = [token, position, cache_position, pad_mask, *kv]
    feed = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs, strict=True)}
    plain = session.run(["logits"], feed)[0]
    ours = rt.decode(*inputs[:4], kv)
    np.testing.assert_allclose(plain, ours.numpy(), atol=1e-5, rtol=0)


@torch.inference_mode()
def test_onnxruntime_reads_the_eager_weights_unless_prepacked(bundle, onnx_runtime):
    """One copy of the weights: the session is lent the eager model's tensors, so an in-place change
    to one changes its output. Prepacking gives ONNX Runtime a copy of its own, which does not change."""
    shared, prepacked = onnx_runtime("tiny-llama"), load(bundle("tiny-llama"), backend="onnxruntime", prepack=True)
    ids = torch.tensor([[5, 9, 30, 41, 7]])
    for rt, follows in ((shared, True), (prepacked, False)):
        token, position, cache_position, pad_mask, kv = _prefilled(rt, ids)
        before = rt.decode(token, position, cache_position, pad_mask, [t.clone() for t in kv])
        rt.model.lm_head.weight.mul_(2)
        try:
            after = rt.decode(token, position, cache_position, pad_mask, [t.clone() for t in kv])
        finally:
            rt.model.lm_head.weight.div_(2)
        if follows:
            torch.testing.assert_close(after, 2 * before)
        else:
            torch.testing.assert_close(after, before)


@torch.inference_mode()
def test_the_onnx_step_writes_the_cache_like_the_compiled_one(onnx_runtime, runtime):
    """ONNX drops in-place updates; the runtime writes the returned keys and values into the same
    slots the .so writes (a ring's slot wraps: position 11 of a window of 8 is slot 3)."""
    ort_rt, aoti_rt = onnx_runtime("tiny-gemma3"), runtime("tiny-gemma3")
    ids = torch.arange(3, 14)[None]  # 11 tokens: past the window
    results = []
    rows = aoti_rt.decode.batches[0]  # the .so's smallest graph; ONNX takes any batch
    for rt in (ort_rt, aoti_rt):
        token, position, cache_position, pad_mask, kv = _prefilled(rt, ids, rows)
        logits = rt.decode(token, position, cache_position, pad_mask, kv)
        results.append((logits, kv))
    (ort_logits, ort_kv), (aoti_logits, aoti_kv) = results
    torch.testing.assert_close(ort_logits, aoti_logits, atol=1e-4, rtol=0)
    for a, b in zip(ort_kv, aoti_kv, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_onnx_decode_checks_its_inputs_first(onnx_runtime):
    rt = onnx_runtime("tiny-llama")
    token, position, cache_position, pad_mask, kv = _prefilled(rt, torch.tensor([[5, 9, 30]]))
    with pytest.raises(InvalidInputError, match="cache_position 160 is outside"):
        rt.decode(token, position, torch.tensor([160]), pad_mask, kv)
    with pytest.raises(InvalidInputError, match="layer 0 keys has dtype torch.float16"):
        rt.decode(token, position, cache_position, pad_mask, [kv[0].half(), *kv[1:]])


def test_onnx_backend_runs_where_the_so_cannot(bundle, tmp_path, capsys):
    """A bundle built by another torch: the .so is refused, the ONNX decode loads and still matches."""
    copy = tmp_path / "bundle"
    shutil.copytree(bundle("tiny-llama"), copy)
    raw = json.loads((copy / MANIFEST).read_text())
    raw.pop("digest")
    raw |= {"torch_version": "2.99.0", "cpu_isa": "AVX512"}
    (copy / MANIFEST).write_text(json.dumps(raw | {"digest": _digest(raw)}))
    with pytest.raises(IncompatibleBundleError, match="torch 2.99.0"):
        load(copy)
    assert aotpack(["verify", str(copy)]) == 2 and "torch 2.99.0" in capsys.readouterr().err
    assert aotpack(["verify", str(copy), "--backend", "onnxruntime"]) == 0
    assert "its onnxruntime decode is compatible" in capsys.readouterr().out
    ids = torch.tensor([[5, 9, 30, 41, 7]])
    expected = load(bundle("tiny-llama")).generate(ids, max_new_tokens=12)
    assert torch.equal(load(copy, backend="onnxruntime").generate(ids, max_new_tokens=12), expected)


def test_backend_choices_are_checked_before_loading(bundle):
    plain = bundle("tiny-llama", "--gemv", "aten")  # no --onnx
    with pytest.raises(BundleError, match="has no ONNX decode; re-export it with `aotpack export ... --onnx`"):
        load(plain, backend="onnxruntime")
    with pytest.raises(InvalidInputError, match="backend 'tvm' is not one of"):
        load(plain, backend="tvm")
    with pytest.raises(InvalidInputError, match="prepacking applies to the onnxruntime backend only"):
        load(plain, prepack=True)


def test_a_changed_decode_onnx_is_refused(bundle, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(bundle("tiny-llama"), copy)
    data = bytearray((copy / DECODE_ONNX).read_bytes())
    data[len(data) // 2] ^= 1
    (copy / DECODE_ONNX).write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="'decode.onnx' has sha256"):
        load(copy, backend="onnxruntime")


@pytest.mark.parametrize("edit", ["vocab", "dtype"])
def test_a_rehashed_decode_onnx_returning_other_outputs_is_refused_at_load(bundle, tmp_path, edit):
    """A consistent edit (hash recomputed) whose logits are another size or type used to fail at the first
    step with onnxruntime's raw RuntimeError, failing every request in that step."""
    from helpers import rewrite_manifest

    from runtime.format.files import sha256

    copy = tmp_path / "bundle"
    shutil.copytree(bundle("tiny-llama"), copy)
    graph = onnx.load(str(copy / DECODE_ONNX), load_external_data=False)
    producer = next(node for node in graph.graph.node if "logits" in node.output)
    producer.output[list(producer.output).index("logits")] = "logits_raw"
    logits = graph.graph.output[0].type.tensor_type
    if edit == "vocab":  # one column fewer: a graph whose output is really another shape
        logits.shape.dim[1].dim_value -= 1
        bounds = [onnx.helper.make_tensor(n, onnx.TensorProto.INT64, [1], [v]) for n, v in
                  (("cut_start", 0), ("cut_end", logits.shape.dim[1].dim_value), ("cut_axis", 1))]  # fmt: skip
        graph.graph.initializer.extend(bounds)
        cut = onnx.helper.make_node("Slice", ["logits_raw", "cut_start", "cut_end", "cut_axis"], ["logits"])
    else:  # doubles instead of floats
        logits.elem_type = onnx.TensorProto.DOUBLE
        cut = onnx.helper.make_node("Cast", ["logits_raw"], ["logits"], to=onnx.TensorProto.DOUBLE)
    graph.graph.node.append(cut)
    onnx.save(graph, str(copy / DECODE_ONNX))
    files = json.loads((copy / MANIFEST).read_text())["files"]
    rewrite_manifest(copy, files=files | {DECODE_ONNX: sha256(copy / DECODE_ONNX)})
    with pytest.raises(BundleError, match="decode.onnx's output 'logits' is tensor"):
        load(copy, backend="onnxruntime")


@pytest.mark.parametrize(
    "options, message",
    [
        (["--dtype", "bfloat16"], "--onnx exports float32 decodes only; use --dtype float32"),
        (["--quantize", "int8"], "--onnx exports float32 decodes only; drop --quantize int8"),
        (["--device", "cuda"], "--onnx exports for ONNX Runtime's CPU provider"),
    ],
)
def test_export_onnx_refuses_what_it_cannot_build(options, message, tmp_path, capsys):
    assert aotpack(["export", "tiny-llama", "--out", str(tmp_path / "b"), "--onnx", *options]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_cli_runs_either_backend_alike(bundle, capsys):
    path = str(bundle("tiny-llama"))
    replies = []
    for backend in ("aoti", "onnxruntime"):
        assert (
            aotpack(["run", path, "--prompt", "Hello", "--greedy", "--max-new-tokens", "12", "--backend", backend]) == 0
        )
        replies.append(capsys.readouterr().out)
    assert replies[0] == replies[1] and replies[0].strip()
    assert aotpack(["inspect", path]) == 0
    assert "onnx         decode.onnx (opset" in capsys.readouterr().out


def _prefilled(rt, ids, rows: int | None = None):
    """Eager prefill of `ids` (1, S) into fresh cache tensors, in `rows` rows; the next decode call's inputs."""
    return prefilled_step(rt, ids, rows)[0]
