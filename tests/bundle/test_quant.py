"""Weight-only int8/int4 bundles: parity against the eager quantized model, one copy of every quantized
tensor, and the build-time GEMV choice (the packed format and kernels alone: tests/unit/test_quant_kernels.py;
the float fused reduction, `--gemv reduce`, at every batch with left padding: tests/bundle/test_buckets.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from helpers import assert_parity, chat

from exporter.lowering import CANDIDATES, LINEAR
from runtime.backends.checks import lend_constants
from runtime.quant import INT4, QuantizedLinear

QUANTIZED = {  # preset -> export options: both methods, three families, a sliding window and images
    "tiny-llama": ("--quantize", "int8"),
    "tiny-gemma3": ("--quantize", "int4"),
    # one graph for all 4 rows, where the float VLM bundle has two: an int4 graph compiles in about 2 min
    "tiny-gemma3-vlm": ("--quantize", "int4", "--group-size", "64", "--batch-buckets", "4"),
}
CONVERSATION = [[{"role": "user", "content": "Why is the sky blue?"}]]


def _on(name: str) -> pytest.MarkDecorator:
    """The tests of one quantized bundle run on one xdist worker, each bundle's beside the others'."""
    return pytest.mark.xdist_group(f"quantized-{name}")


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(name, marks=_on(name)) for name in QUANTIZED])
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
@_on("tiny-llama")
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
@_on("tiny-gemma3")
def test_quantized_manifest_records_accuracy(runtime):
    m = runtime("tiny-gemma3", *QUANTIZED["tiny-gemma3"]).manifest
    a = m.accuracy
    assert a.text_tokens > 100 and a.greedy_tokens == 256 and 0 <= a.greedy_agreement <= 1
    assert a.perplexity > 0 and a.reference_perplexity > 0
    lowerings = [lw for graph in m.graphs for lw in graph.lowerings]
    assert {lw.op for lw in lowerings} == {INT4} and all(lw.chosen == "reduce-nibbles" for lw in lowerings)


@pytest.mark.slow
@pytest.mark.xdist_group("tuned-tiny-gemma3")
def test_tuned_bundle_records_every_candidate_and_keeps_the_fastest(runtime, reference):
    """`--gemv tune` times ATen's mm and the Inductor reduction for every weight shape; the manifest
    keeps both rates and the faster choice, and the bundle still matches HF past the window."""
    rt = runtime("tiny-gemma3", "--gemv", "tune")
    (graph,) = rt.manifest.graphs  # the batch-4 graph, timed with 4 rows
    shapes = {(lw.rows, lw.cols) for lw in graph.lowerings}
    assert (384, 64) in shapes  # the lm_head
    for lw in graph.lowerings:
        assert set(lw.gb_per_s) == set(CANDIDATES[LINEAR]) and all(rate > 0 for rate in lw.gb_per_s.values())
        assert lw.chosen == max(lw.gb_per_s, key=lw.gb_per_s.get)
    ids = torch.arange(3, 16)[None]  # 13 tokens: past the window of 8
    assert_parity(
        rt, reference("tiny-gemma3"), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, new_tokens=40
    )
