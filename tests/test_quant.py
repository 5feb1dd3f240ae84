"""Weight-only int8/int4 bundles: the packed format, the decode kernels, parity against the eager
quantized model, one copy of every quantized tensor, and the build-time GEMV choice."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from helpers import assert_parity, chat

from exporter.config import ExportConfig
from exporter.lowering import CANDIDATES, LINEAR
from exporter.quantize import pack, packed_weight
from runtime.decode import lend_constants
from runtime.errors import ExportError
from runtime.quant import INT4, INT8, QuantizedLinear, QuantSpec, dequantize

SPECS = [QuantSpec(INT8, None), QuantSpec(INT4, 32), QuantSpec(INT4, 64)]
QUANTIZED = {  # preset -> export options: both methods, three families, a sliding window and images
    "tiny-llama": ("--quantize", "int8"),
    "tiny-gemma3": ("--quantize", "int4"),
    "tiny-gemma3-vlm": ("--quantize", "int4", "--group-size", "64"),
}
CONVERSATION = [[{"role": "user", "content": "Why is the sky blue?"}]]


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_packing_round_trips_values_on_the_grid(spec):
    """A weight that lies exactly on the quantization grid comes back exactly."""
    g = torch.Generator().manual_seed(0)
    rows, cols = 6, 128
    if spec.method == INT8:
        q = torch.randint(-127, 128, (rows, cols), generator=g).float()
        q[:, 0] = 127  # the row maximum fixes the scale
        weight = q * torch.rand(rows, 1, generator=g)
    else:
        q = torch.randint(0, 16, (rows, cols // spec.group_size, spec.group_size), generator=g).float()
        q[..., 0], q[..., 1] = 0, 15  # each group's min and max fix its scale and min
        scale = torch.rand(rows, cols // spec.group_size, 1, generator=g).bfloat16().float()
        low = torch.randn(rows, cols // spec.group_size, 1, generator=g).bfloat16().float()
        weight = (q * scale + low).view(rows, cols)
    restored = dequantize(spec, *pack(spec, weight))
    torch.testing.assert_close(restored, weight, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_packing_error_is_within_half_a_step(spec):
    weight = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    tensors = pack(spec, weight)
    error = (dequantize(spec, *tensors) - weight).abs()
    if spec.method == INT8:
        step = tensors[1][:, None]  # one scale per row
    else:
        step = tensors[1].float().repeat_interleave(spec.group_size, dim=1)
    assert (error <= step / 2 + 1e-2 * step).all()  # half a step, plus the bf16 rounding of int4's min


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_decode_kernel_computes_the_eager_op(spec, dtype):
    """The Inductor lowerings, evaluated eagerly, equal the eager op on a batch of 3 (fp32 summation order)."""
    g = torch.Generator().manual_seed(2)
    linear = QuantizedLinear(packed_weight(spec, torch.randn(96, 128, generator=g)))
    x = torch.randn(3, 1, 128, generator=g).to(dtype)
    expected = linear(x)
    args = linear.packed.tensors() + ((spec.group_size,) if spec.method == INT4 else ())
    for name, kernel in CANDIDATES[spec.method].items():
        got = kernel(x, *args)
        assert got.shape == expected.shape and got.dtype == dtype, name
        torch.testing.assert_close(
            got.float(), expected.float(), atol=1e-4 if dtype == torch.float32 else 2e-2, rtol=1e-3
        )


def test_float_decode_kernels_compute_linear():
    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(2, 1, 48, generator=g), torch.randn(80, 48, generator=g), torch.randn(80, generator=g)
    for kernel in CANDIDATES[LINEAR].values():
        torch.testing.assert_close(kernel(x, w, b), torch.nn.functional.linear(x, w, b), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(QUANTIZED))
def test_quantized_bundle_matches_its_eager_model(name, runtime):
    """Greedy tokens identical to HF eager generate on the same quantized model (rt.model is the eager
    model the bundle builds), raw logits within 1e-4 in fp32, past the window of 8 where there is one."""
    rt = runtime(name, *QUANTIZED[name])
    q = rt.manifest.quantization
    assert q.method == QUANTIZED[name][1] and len(q.linears) > 0 and q.embedding is not None
    assert all(isinstance(rt.model.get_submodule(path), QuantizedLinear) for path in q.linears)
    inputs = chat(rt, CONVERSATION)
    assert_parity(rt, rt.model, inputs, new_tokens=40)


@pytest.mark.slow
def test_loading_a_quantized_bundle_leaves_subnormals_alone(bundle):
    """Its .so is built with unsafe-math flags, and GCC 12 links crtfastmath.o into it: loading it set
    flush-to-zero in the loading thread (and every thread started after), for the whole process."""
    path = bundle(*next((name, *options) for name, options in QUANTIZED.items()))
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
    assert head.words.data_ptr() in {t.data_ptr() for t in lent.values()}
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
def test_quantized_manifest_records_accuracy(runtime):
    m = runtime("tiny-gemma3", *QUANTIZED["tiny-gemma3"]).manifest
    a = m.accuracy
    assert a.text_tokens > 100 and a.greedy_tokens == 256 and 0 <= a.greedy_agreement <= 1
    assert a.perplexity > 0 and a.reference_perplexity > 0
    assert {lw.op for lw in m.lowerings} == {INT4} and all(lw.chosen == "reduce-nibbles" for lw in m.lowerings)


@pytest.mark.slow
def test_tuned_bundle_records_every_candidate_and_keeps_the_fastest(runtime, reference):
    """`--gemv tune` times ATen's mm and the Inductor reduction for every weight shape; the manifest
    keeps both rates and the faster choice, and the bundle still matches HF past the window."""
    rt = runtime("tiny-gemma3", "--gemv", "tune")
    shapes = {(lw.rows, lw.cols) for lw in rt.manifest.lowerings}
    assert (384, 64) in shapes  # the lm_head
    for lw in rt.manifest.lowerings:
        assert set(lw.gb_per_s) == set(CANDIDATES[LINEAR]) and all(rate > 0 for rate in lw.gb_per_s.values())
        assert lw.chosen == max(lw.gb_per_s, key=lw.gb_per_s.get)
    ids = torch.arange(3, 16)[None]  # 13 tokens: past the window of 8
    assert_parity(
        rt, reference("tiny-gemma3"), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, new_tokens=40
    )


def test_reduce_kernels_bundle_matches_hf(runtime, reference):
    """Every float weight read by the fused reduction (`--gemv reduce`), batched with left padding."""
    rt = runtime("tiny-llama", "--gemv", "reduce")
    assert {lw.chosen for lw in rt.manifest.lowerings} == {"reduce"}
    inputs = chat(rt, CONVERSATION + [[{"role": "user", "content": "Describe the image."}]])
    assert (inputs["attention_mask"] == 0).any()
    assert_parity(rt, reference("tiny-llama"), inputs, new_tokens=40)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"quantize": "int3"}, "--quantize 'int3'"),
        ({"quantize": "int8", "group_size": 32}, "--group-size applies to --quantize int4 only"),
        ({"quantize": "int4", "group_size": 48}, "--group-size 48"),
        ({"gemv": "fastest"}, "--gemv 'fastest'"),
    ],
)
def test_bad_quantization_options_are_refused_before_loading(options, message, tmp_path):
    with pytest.raises(ExportError, match=message.replace("(", r"\(")):
        ExportConfig(model="tiny-llama", out=tmp_path / "b", **options)


def test_group_size_that_does_not_divide_the_layer_is_refused(tmp_path):
    from exporter.export import export

    config = ExportConfig(model="tiny-llama", out=tmp_path / "b", quantize="int4", group_size=128, gemv="aten")
    with pytest.raises(ExportError, match="cannot pack"):  # tiny-llama's layers have 64 input columns
        export(config, log=lambda _: None)
    assert not (tmp_path / "b").exists()
