"""Canaries: every private torch/transformers symbol aotpack relies on still exists and still takes
what aotpack passes it (a pinned-version upgrade fails here in a second, naming the symbol)."""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from exporter import compat as exporter_compat
from runtime import compat
from runtime.format.manifest import DecodeAttention


def _owner(owner):
    """An object, or a dotted name: a module, or a class inside one."""
    if not isinstance(owner, str):
        return owner
    try:
        return importlib.import_module(owner)
    except ModuleNotFoundError:
        module, _, name = owner.rpartition(".")
        return getattr(importlib.import_module(module), name)


def _signature_text(obj) -> str:
    """A C++ function's (pybind's docstring) or an operator's (its schema) signature, as text."""
    if isinstance(obj, torch._ops.OpOverloadPacket):
        return str(obj.default._schema)
    return (obj.__init__ if isinstance(obj, type) else obj).__doc__ or ""


@pytest.mark.parametrize(
    ("owner", "name", "expected"),
    compat.PRIVATE_SYMBOLS + exporter_compat.PRIVATE_SYMBOLS,
    ids=lambda v: getattr(v, "__name__", str(v))[:40],
)
def test_private_symbol_keeps_its_signature(owner, name, expected):
    where = f"{owner}.{name}: update runtime/compat.py or exporter/compat.py"
    owner = _owner(owner)
    assert hasattr(owner, name), f"{where} (gone)"
    found = inspect.getattr_static(owner, name)
    if expected == "property":
        assert isinstance(found, property) and found.fset is not None, f"{where} (no longer a settable property)"
    elif isinstance(expected, str):
        assert expected in _signature_text(getattr(owner, name)), f"{where} (signature changed)"
    elif expected is not None:
        missing = [p for p in expected if p not in inspect.signature(getattr(owner, name)).parameters]
        assert not missing, f"{where} (takes no {missing})"


def test_special_tokens_are_read_from_what_transformers_sets():
    """compat.special_tokens reads the private tensors `_prepare_special_tokens` leaves on the config."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))  # fmt: skip
    config = GenerationConfig(eos_token_id=[3, 4], pad_token_id=None)
    assert compat.special_tokens(model, config, "cpu") == ((3, 4), 3)  # pad falls back to the first eos
    assert all(hasattr(config, name) for name in compat.SET_BY_TRANSFORMERS)


@pytest.mark.parametrize("kernel", ["flash", "grouped", "native"])
@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-llama"])
def test_decode_attention_is_the_chosen_kernel_with_a_dynamic_batch(checkpoint, name, kernel):
    """Traced with a dynamic batch, SDPA fell to its math path (Inductor loops: a batch-8 bundle's step
    took 2x a batch-1 bundle's at batch 1). The decode graph calls the chosen kernel instead (the flash
    kernel itself, with the model's heads or grouped, or aotpack's), computes what SDPA computes, and the
    model's attention implementation is restored after the trace."""
    import torch

    from exporter import attention, kernels
    from exporter.compile import example_inputs, export_decode
    from exporter.model import cache_layout, decode_module, load_model
    from runtime.format.contract import DecodeContract

    model, _ = load_model(checkpoint(name), "float32", "cpu")
    layout = cache_layout(model, 32)
    contract = DecodeContract(layout, 2, 32, "float32", "cpu")
    step = decode_module(model, layout)
    inputs = example_inputs(contract)
    for t in inputs[4:]:
        t.normal_()
    if kernel == "native":
        kernels.build(log=lambda _: None)  # serves the eager op
    with torch.inference_mode():
        expected = step(*inputs)
        with attention.installed(model, DecodeAttention(kernel, {}, 0)):
            got = step(*inputs)
            exported = export_decode(step, contract)
    assert compat.attention_implementation(model.config) == "sdpa"
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    if kernel == "native":
        calls = [n for n in exported.graph.nodes if "aotpack.decode_attention" in str(n.target)]
        assert len(calls) == len(layout)
        assert not [n for n in exported.graph.nodes if "flash_attention" in str(n.target)]
        return
    flash = [n for n in exported.graph.nodes if "_scaled_dot_product_flash_attention_for_cpu" in str(n.target)]
    assert len(flash) == len(layout)
    # grouped: each call's query heads are the key/value heads (their query heads are its rows)
    heads = {n.args[0].meta["val"].shape[1] for n in flash}
    config = model.config.get_text_config()
    assert heads == {config.num_key_value_heads if kernel == "grouped" else config.num_attention_heads}


def test_each_graphs_compiled_files_are_kept_with_its_own_metadata(tmp_path):
    """AOTInductor writes a graph's metadata beside its code in the shared Inductor cache, named by the
    code alone: another process compiling the same graph for another bundle rewrites it. The export
    keeps a private copy of each graph's files, whose metadata is this graph's."""
    from exporter.compile import _kept
    from runtime.format.contract import METADATA_KEY

    shared = tmp_path / "torchinductor" / "cabc"
    shared.mkdir(parents=True)
    (shared / "cabc.wrapper.so").write_bytes(b"\x7fELF")
    (shared / "cabc.wrapper_metadata.json").write_text(
        json.dumps({METADATA_KEY: "another bundle's", "AOTI_DEVICE_KEY": "cpu"})
    )
    files = [str(shared / "cabc.wrapper.so"), str(shared / "cabc.wrapper_metadata.json"), ""]
    kept = _kept(files, tmp_path / "batch4", {METADATA_KEY: "this graph's"})
    assert kept[2] == "" and [Path(f).parent for f in kept[:2]] == [tmp_path / "batch4"] * 2
    assert json.loads(Path(kept[1]).read_text()) == {METADATA_KEY: "this graph's", "AOTI_DEVICE_KEY": "cpu"}
    (shared / "cabc.wrapper_metadata.json").write_text("{}")  # the other process again: the copy is unaffected
    assert json.loads(Path(kept[1]).read_text())[METADATA_KEY] == "this graph's"


def test_loops_of_small_static_size_compile_without_a_parallel_region(monkeypatch):
    """exporter.compat.serial_small_loops: while compiling, a loop nest of static size up to SERIAL_UP_TO
    elements gets parallel depth 0 (serial code), whatever Inductor chose; a larger one, or one whose size
    depends on a dynamic dimension (the span, the batch), or any compiled by a process of one thread, keeps
    Inductor's choice; afterwards Inductor's own method is back."""
    import sympy
    from torch._inductor.codegen import cpp

    from exporter.compat import SERIAL_UP_TO, serial_small_loops

    def inductors(self, max_parallel_depth, threads):  # stands for Inductor's choice: one parallel level
        return cpp.ParallelDepth(parallel_depth=1, start_depth=2)

    monkeypatch.setattr(cpp.CppKernel, "decide_parallel_depth", inductors)
    span = sympy.Symbol("s0", integer=True, positive=True)
    nests = {(640,): 0, (4, 256): 0, (SERIAL_UP_TO,): 0, (8, 640): 1, (SERIAL_UP_TO + 1,): 1, (span, 4): 1, (): 0}
    with serial_small_loops():
        for extents, depth in nests.items():
            chosen = cpp.CppKernel.decide_parallel_depth(SimpleNamespace(call_ranges=list(extents)), None, 2)
            assert (chosen.parallel_depth, chosen.start_depth) == (depth, 2), extents
            one = cpp.CppKernel.decide_parallel_depth(SimpleNamespace(call_ranges=list(extents)), None, 1)
            assert one.parallel_depth == 1  # compiled with one thread: Inductor's choice (tests/slow/test_codegen.py)
    assert cpp.CppKernel.decide_parallel_depth is inductors
