"""Canaries: every private torch/transformers symbol aotpack relies on still exists (a pinned-version
upgrade fails here in a second, naming the symbol), and the runtime never imports the exporter."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from exporter import compat as exporter_compat
from runtime import compat


def _owner(owner):
    """An object, or a dotted name: a module, or a class inside one."""
    if not isinstance(owner, str):
        return owner
    try:
        return importlib.import_module(owner)
    except ModuleNotFoundError:
        module, _, name = owner.rpartition(".")
        return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize(
    ("owner", "name"),
    compat.PRIVATE_SYMBOLS + exporter_compat.PRIVATE_SYMBOLS,
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_private_symbol_exists(owner, name):
    assert hasattr(_owner(owner), name), f"{owner}.{name} is gone: update runtime/ or exporter/compat.py"


def test_runtime_never_imports_the_exporter(bundle):
    """Importing every runtime module, loading a bundle and generating leave `exporter` unimported."""
    code = (
        "import sys, pkgutil, importlib, torch, runtime\n"
        "for m in pkgutil.iter_modules(runtime.__path__):\n"
        "    if m.name != '__main__': importlib.import_module(f'runtime.{m.name}')\n"
        f"rt = runtime.load({str(bundle('tiny-llama'))!r})\n"
        "rt.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=2)\n"
        "bad = sorted(m for m in sys.modules if m == 'exporter' or m.startswith('exporter.'))\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_runtime_commands_work_without_the_exporter(bundle):
    """`python -m runtime verify|inspect` with the exporter package made unimportable."""
    path = str(bundle("tiny-llama"))
    for command in ("verify", "inspect"):
        code = (
            "import sys; sys.modules['exporter'] = None\n"
            f"from runtime.cli import main; sys.exit(main([{command!r}, {path!r}]))"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert ("OK" if command == "verify" else "LlamaForCausalLM") in done.stdout


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-llama"])
def test_decode_attention_is_atens_cpu_flash_kernel_with_a_dynamic_batch(checkpoint, name):
    """Traced with a dynamic batch, SDPA fell to its math path (Inductor loops: a batch-8 bundle's step
    took 2x a batch-1 bundle's at batch 1). The decode graph calls the flash kernel itself, computes what
    SDPA computes, and the model's attention implementation is restored after the trace."""
    import torch

    from exporter.compat import cpu_flash_decode_attention
    from exporter.compile import export_decode
    from exporter.model import cache_layout, decode_module, load_model
    from runtime.contract import DecodeContract

    model, _ = load_model(checkpoint(name), "float32", "cpu")
    layout = cache_layout(model, 32)
    contract = DecodeContract(layout, 2, 32, "float32", "cpu")
    step = decode_module(model, layout)
    inputs = contract.example_inputs()
    for t in inputs[4:]:
        t.normal_()
    with torch.inference_mode():
        expected = step(*inputs)
        with cpu_flash_decode_attention(model):
            got = step(*inputs)
            exported = export_decode(step, contract)
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    calls = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert sum("_scaled_dot_product_flash_attention_for_cpu" in c for c in calls) == len(layout)
