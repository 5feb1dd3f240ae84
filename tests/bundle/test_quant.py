"""Quantized bundles: parity against the eager quantized model, one copy of every quantized tensor, the
integer kernels carried and checked like the rest of the bundle, and the build-time GEMV choice (the
packed formats and kernels alone: tests/unit/test_quant_kernels.py, tests/unit/test_integer_kernels.py; the
float fused reduction, `--gemv reduce`, at every batch with left padding: tests/bundle/test_buckets.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import pytest
import torch
from helpers import assert_parity, chat

from exporter.lowering import CANDIDATES, LINEAR, known_good
from runtime import load
from runtime.backends.checks import lend_constants
from runtime.cpu import KERNEL_ISA_FLAGS
from runtime.errors import IncompatibleBundleError, IntegrityError
from runtime.format.files import KERNELS, sha256
from runtime.format.manifest import BF16_LOWERINGS
from runtime.format.reader import read_manifest
from runtime.quant import QuantizedLinear

QUANTIZED = {  # preset -> export options: both methods, both kernel families, three families, a window, images
    "tiny-llama": ("--quantize", "int8", "--quant-kernels", "integer"),
    # the tiny models' width (64) is not a multiple of 256: `mixed` would hold every layer at int5 or int8
    "tiny-gemma3": ("--quantize", "int4", "--quant-kernels", "integer", "--recipe", "sensitive"),
    # `mixed` (the default): every weight is narrower than 256 columns, so the integer family holds the
    # sensitive ones (the last layer's v and down projections, the lm_head, the embedding) at int8 and the
    # rest at int5 (llama.cpp's Q5_0 fallback); the window of 8 as well
    "tiny-mistral": ("--quantize", "int4", "--quant-kernels", "integer"),
    # Inductor's kernels, with aotpack's native decode attention (the bundle then carries kernels.so for it
    # alone); one graph for all 4 rows, where the float VLM bundle has two: an int4 graph compiles in about 2 min
    "tiny-gemma3-vlm": (
        "--quantize", "int4", "--group-size", "64", "--batch-buckets", "4", "--quant-kernels", "inductor",
        "--recipe", "uniform", "--decode-attention", "native",
    ),
}  # fmt: skip
CONVERSATION = [[{"role": "user", "content": "Why is the sky blue?"}]]


# The quantized VLM bundle (an int4 graph with Inductor's kernels, about 4 minutes of tests with its
# compile) is opt-in: `-m heavy` (pyproject), so that the default run stays within its time.
HEAVY = {"tiny-gemma3-vlm"}


def _marks(name: str) -> list[pytest.MarkDecorator]:
    return [pytest.mark.heavy] if name in HEAVY else []


def _on(name: str):
    def marked(test):
        for mark in _marks(name):
            test = mark(test)
        return test

    return marked


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(name, marks=_marks(name)) for name in QUANTIZED])
def test_quantized_bundle_matches_its_eager_model(name, runtime):
    """Greedy tokens identical to HF eager generate on the same quantized model (rt.model is the eager
    model the bundle builds), raw logits within 1e-4 in fp32, past the window of 8 where there is one."""
    rt = runtime(name, *QUANTIZED[name])
    q = rt.manifest.quantization
    assert q.method == QUANTIZED[name][1] and len(q.linears) > 0 and q.embedding is not None
    assert q.kernels == QUANTIZED[name][QUANTIZED[name].index("--quant-kernels") + 1]
    native_attention = rt.manifest.decode_attention is not None and rt.manifest.decode_attention.chosen == "native"
    assert (rt.manifest.native is not None) == (q.kernels == "integer" or native_attention)
    assert native_attention or "native" not in QUANTIZED[name]  # named: taken (Inductor's family too)
    assert all(isinstance(rt.model.get_submodule(path), QuantizedLinear) for path in q.linears)
    inputs = chat(rt, CONVERSATION)
    assert_parity(rt, rt.model, inputs, new_tokens=40)


@pytest.mark.slow
@_on("tiny-gemma3-vlm")
def test_loading_a_quantized_bundle_leaves_subnormals_alone(bundle):
    """An Inductor-kernel bundle's .so is built with unsafe-math flags, and GCC 12 links crtfastmath.o into
    it: loading it set flush-to-zero in the loading thread (and every thread started after), for the whole
    process."""
    path = bundle("tiny-gemma3-vlm", *QUANTIZED["tiny-gemma3-vlm"])
    probe = "torch.tensor([1e-40]).mul(1.0).item()"
    script = (
        f"import torch, threading; from runtime import load; rt = load({str(path)!r}); seen = []; "
        f"t = threading.Thread(target=lambda: seen.append({probe})); t.start(); t.join(); print({probe}, seen[0])"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    here, there = map(float, done.stdout.split())
    assert here > 0 and there > 0  # 1e-40 survives: subnormals are not flushed


@pytest.mark.slow
@_on("tiny-gemma3-vlm")
def test_quantized_vlm_with_an_image_matches_its_eager_model(runtime):
    from PIL import Image

    rt = runtime("tiny-gemma3-vlm", *QUANTIZED["tiny-gemma3-vlm"])
    image = Image.new("RGB", (32, 32), (40, 120, 200))
    messages = [
        [
            {
                "role": "user",
                "content": [{"type": "image", "image": image}, {"type": "text", "text": "Describe the image."}],
            }
        ]
    ]
    inputs = chat(rt, messages)
    assert "pixel_values" in inputs
    assert_parity(rt, rt.model, inputs, new_tokens=24)


@pytest.mark.slow
@_on("tiny-llama")
def test_quantized_weights_are_stored_once_and_lent_to_the_decode(runtime):
    """No float copy of a quantized weight exists, and an in-place change to a stored quantized tensor
    changes the compiled output: the .so reads the eager model's own packed tensors."""
    rt = runtime("tiny-llama", *QUANTIZED["tiny-llama"])
    q = rt.manifest.quantization
    state = rt.model.state_dict()
    assert not any(f"{path}.weight" in state for path in q.linears)
    lent = lend_constants(rt.model, rt.manifest.constants, rt.manifest.device)
    buffers = {b.data_ptr() for b in rt.model.buffers()}
    head = rt.model.get_submodule("lm_head").packed
    assert head.codes.data_ptr() in {t.data_ptr() for t in lent.values()}
    assert all(t.data_ptr() in buffers or t.dtype.is_floating_point for t in lent.values())
    ids = torch.tensor([[5, 9, 30, 41, 7]])
    before = rt.generate(input_ids=ids, max_new_tokens=3, min_new_tokens=3)
    steps = [logits for _, logits in rt.iter_steps(input_ids=ids, max_new_tokens=3, min_new_tokens=3)]
    head.scales.mul_(2)  # int8: every lm_head output doubles
    try:
        doubled = [logits for _, logits in rt.iter_steps(input_ids=before[:, :6], max_new_tokens=2, min_new_tokens=2)]
    finally:
        head.scales.div_(2)
    torch.testing.assert_close(doubled[1], 2 * steps[2], rtol=1e-4, atol=1e-4)  # the compiled step's logits


@pytest.mark.slow
@_on("tiny-gemma3")
def test_quantized_manifest_records_accuracy(runtime):
    m = runtime("tiny-gemma3", *QUANTIZED["tiny-gemma3"]).manifest
    a = m.accuracy
    assert a.text_tokens > 100 and a.greedy_tokens == 256 and 0 <= a.greedy_agreement <= 1
    assert a.perplexity > 0 and a.reference_perplexity > 0
    lowerings = [lw for graph in m.graphs for lw in graph.lowerings]
    assert {lw.op for lw in lowerings} == {"int4-dot", "int8-dot"} and all(lw.chosen == "dot" for lw in lowerings)
    q = m.quantization
    assert q.recipe == "sensitive" and "lm_head" in q.int8_paths and q.scales == "mse"


@pytest.mark.slow
def test_tuned_bundle_records_every_candidate_and_keeps_the_fastest(runtime, reference):
    """`--gemv tune` times ATen's mm, the Inductor reduction and aotpack's dense GEMM for every weight
    shape (not the bf16 ones, AMX tiles and dpbf16: a float32 bundle); the manifest keeps every rate and
    spread and the faster choice (where the timing was judged noise, as tests running beside each other
    make it, the known-good one or the fastest: exporter.lowering.kept), and the bundle still matches HF
    past the window."""
    rt = runtime("tiny-gemma3", "--gemv", "tune")
    (graph,) = rt.manifest.graphs  # the batch-4 graph, timed with 4 rows
    shapes = {(lw.rows, lw.cols) for lw in graph.lowerings}
    assert (384, 64) in shapes  # the lm_head
    for lw in graph.lowerings:
        timed = set(CANDIDATES[LINEAR]) - set(BF16_LOWERINGS)
        assert set(lw.gb_per_s) == timed and all(r > 0 for r in lw.gb_per_s.values())
        assert lw.spread.keys() == lw.gb_per_s.keys() and all(s >= 0 for s in lw.spread.values())
        fastest = max(lw.gb_per_s, key=lw.gb_per_s.get)
        assert lw.chosen == fastest if not lw.noisy else lw.chosen in (known_good(LINEAR, lw.gb_per_s), fastest)
    ids = torch.arange(3, 16)[None]  # 13 tokens: past the window of 8
    assert_parity(
        rt, reference("tiny-gemma3"), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, new_tokens=40
    )


@pytest.mark.slow
@_on("tiny-llama")
def test_integer_bundle_carries_its_kernels_and_calls_them_without_the_proxy_executor(bundle):
    """The kernels are a listed, hashed bundle file; every graph calls their C shims directly (through the
    proxy executor a call cost 19 us, 2.5 ms a Gemma step) and names the library as a dependency. Each
    layer's q, k and v projections are one call, its gate and up projections another (exporter.siblings);
    its o and down projections, and the lm_head, one each."""
    path = bundle("tiny-llama", *QUANTIZED["tiny-llama"])
    m = read_manifest(path)
    assert m.native.file == KERNELS and m.files[KERNELS] == sha256(path / KERNELS)
    assert m.native.isa in KERNEL_ISA_FLAGS and m.native.soname.startswith("libaotpack-kernels-")
    with zipfile.ZipFile(path / "decode.pt2") as package:
        wrappers = [package.read(n).decode() for n in package.namelist() if n.endswith("wrapper.cpp")]
    layers = len(m.cache_layout)
    assert wrappers and all(
        text.count("CHECK(aoti_torch_cpu_dot_linear_int8_cat(") == 2 * layers
        and text.count("CHECK(aoti_torch_cpu_dot_linear_int8(") == 2 * layers + 1
        for text in wrappers
    )
    assert not any("proxy_executor_call_function" in text for text in wrappers)


@pytest.mark.slow
@_on("tiny-llama")
def test_a_cpu_without_the_kernels_instructions_is_refused_before_they_load(bundle, monkeypatch):
    """The kernels would die with SIGILL; the manifest says what they need and load() checks it first."""
    import runtime.cpu

    # what the decode .so needs (AVX2, FMA), without the F16C and BMI2 of the kernels' x86-64-v3
    monkeypatch.setattr(runtime.cpu, "cpu_flags", lambda: {"sse4_2", "avx", "avx2", "fma"})
    path = bundle("tiny-llama", *QUANTIZED["tiny-llama"])
    isa = read_manifest(path).native.isa  # this machine's best path: avx2, avx-vnni, avx512-vnni or amx
    with pytest.raises(IncompatibleBundleError, match=rf"compiled for '{isa}', which this CPU cannot run .*'f16c'"):
        load(path)


@pytest.mark.slow
@_on("tiny-llama")
def test_changed_kernels_are_refused(bundle, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(bundle("tiny-llama", *QUANTIZED["tiny-llama"]), copy)
    data = bytearray((copy / KERNELS).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / KERNELS).write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="kernels.so"):
        load(copy)


@pytest.mark.slow
def test_auto_times_both_kernel_families_and_keeps_the_faster(tmp_path):
    """`--quant-kernels auto`: the integer kernels' builds are timed over every quantized layer's weight, then
    each family on the largest weight, as its graph would run it, at batch 1 and at the bundle's largest
    batch; the rates go in the manifest, the faster totals win."""
    from exporter import kernels, quant_family, quantize
    from exporter.config import ExportConfig
    from exporter.model import load_model
    from exporter.source import checkpoint_dir

    config = ExportConfig(model="tiny-llama", out=tmp_path / "b", quantize="int8", batch_size=2)
    with checkpoint_dir(config.model) as checkpoint:
        model, _ = load_model(checkpoint, "float32", "cpu")
    plan = quantize.plan(model, config.quant_spec("integer"), config.recipe, config.scale_search)
    shapes = {path: tuple(model.get_submodule(path).weight.shape) for path in plan.linears}
    family = quant_family.choose(config, plan, shapes, log=lambda _: None)
    names = ("integer", "inductor", *quant_family.BUILDS)
    assert set(family.rates) == {f"{name}@{batch}" for name in names for batch in (1, 2)}
    assert all(rate > 0 for rate in family.rates.values())
    seconds = {f: sum(1 / v for k, v in family.rates.items() if k.startswith(f"{f}@")) for f in names}
    families, builds = ({f: seconds[f] for f in group} for group in (names[:2], names[2:]))
    noise = (family.noise or "").split("; ")
    family_noise, build_noise = any(n.startswith("at batch") for n in noise), any("builds" in n for n in noise)
    assert family.kernels == (quant_family.KNOWN_GOOD if family_noise else min(families, key=families.get))
    build = quant_family.KNOWN_GOOD_BUILD if build_noise else min(builds, key=builds.get)
    assert (family.built is not None) == (family.kernels == "integer")
    if family.built is not None:  # the faster build, as the manifest's record says
        assert (kernels.ONE_TILE in family.built.record.compiler) == (build == "one-tile")


@pytest.mark.slow
@_on("tiny-mistral")
def test_mixed_int4_holds_q5_0s_weights_at_int5_in_the_compiled_step(runtime, capsys):
    """The integer family's `mixed` recipe: Q4_K_M's Q5_0 weights at int5, its Q6_K ones at int8; each decode
    graph calls the int5 kernel's C shim, and the eager int5 weights are the packed ones (parity with the
    eager model: test_quantized_bundle_matches_its_eager_model)."""
    from exporter.cli import main as aotpack
    from runtime.quant import int5_dot

    rt = runtime("tiny-mistral", *QUANTIZED["tiny-mistral"])
    q = rt.manifest.quantization
    assert q.recipe == "mixed" and set(q.int8_paths) == {
        "lm_head", "model.embed_tokens", "model.layers.1.self_attn.v_proj", "model.layers.1.mlp.down_proj"
    }  # fmt: skip
    assert set(q.int5_paths) == set(q.linears) - set(q.int8_paths)
    layer = rt.model.get_submodule("model.layers.0.self_attn.q_proj")
    assert layer.packed.spec.method == "int5" and layer.packed.scheme is int5_dot.SCHEME
    ops = {lw.op for graph in rt.manifest.graphs for lw in graph.lowerings}
    assert ops == {"int5-dot", "int8-dot"}
    assert aotpack(["inspect", str(rt.source)]) == 0
    out = capsys.readouterr().out
    assert "recipe     mixed: 4 modules at int8 (" in out and f"{len(q.int5_paths)} modules at int5 (" in out


@pytest.mark.slow
@_on("tiny-gemma3")
def test_inspect_shows_the_recipe_and_the_kernels(bundle, capsys):
    from exporter.cli import main as aotpack

    path = bundle("tiny-gemma3", *QUANTIZED["tiny-gemma3"])
    assert aotpack(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    m = read_manifest(path)
    assert f"recipe     sensitive: {len(m.quantization.int8_paths)} modules at int8 (" in out
    assert "the rest at int4; scales fitted per group (mse)" in out
    assert f"kernels    integer: aotpack's {m.native.isa} kernels (kernels.so, " in out
    assert "int8 activations per block of 32, layout lanes16" in out
