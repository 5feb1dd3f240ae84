"""bf16 weights through aotpack's bf16 dot-product GEMMs in a bundle (`--dtype bfloat16 --gemv tiles`,
AMX tiles; `--gemv dpbf16`, AVX512-BF16's `vdpbf16ps`; exporter/csrc/dense.cpp): every graph calls the
kernel through its C shim, the bundle carries kernels built for a path that has it, and greedy tokens
equal HF's bf16 `generate` (logits within the bf16 parity tolerance): a left-padded batch far past the
sliding window through the 4-row graph, one row through the 1-row graph. Each is skipped on a CPU
without its instructions. The kernels themselves: tests/unit/test_bf16_kernels.py."""

from __future__ import annotations

import copy
import zipfile

import pytest
import torch
from helpers import assert_parity, chat, isa_library

from runtime.cpu import DPBF16_FLAG, cpu_flags

NAME = "tiny-gemma3"  # sliding window 8 beside full layers
CONVERSATIONS = [
    [{"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Say hi."}],
]
ISAS = {"tiles": {"amx"}, "dpbf16": {"avx512-vnni", "amx"}}  # the kernels' paths that have each


def _options(lowering: str) -> tuple[str, ...]:
    return ("--dtype", "bfloat16", "--gemv", lowering, "--batch-buckets", "1,4")


def _skip_unless_it_runs(lowering: str) -> None:
    if lowering == "tiles" and not isa_library("amx").tiles:
        pytest.skip("Linux did not grant this process AMX's tile state")
    if lowering == "dpbf16" and DPBF16_FLAG not in (cpu_flags() or set()):
        pytest.skip(f"the dpbf16 lowering needs CPU flag {DPBF16_FLAG!r}, which this machine lacks")


@pytest.fixture(scope="module", params=sorted(ISAS))
def lowered(request, runtime):
    """(lowering, its runtime) for each lowering this machine runs."""
    _skip_unless_it_runs(request.param)
    return request.param, runtime(NAME, *_options(request.param))


@pytest.fixture(scope="module")
def hf_bf16(reference):
    # a copy: `reference` hands every test of the session the same model, and `.to` converts in place (the
    # fp32 parity tests after this module in the same worker compared against bf16 weights and failed)
    return copy.deepcopy(reference(NAME)).to(torch.bfloat16)


def test_every_graph_calls_the_kernel_the_bundle_carries(lowered, bundle):
    lowering, rt = lowered
    m = rt.manifest
    assert {lw.chosen for g in m.graphs for lw in g.lowerings} == {lowering} and m.batches == (1, 4)
    assert m.native is not None and m.native.isa in ISAS[lowering] and m.dtype == "bfloat16"
    assert all(g.parity.max_abs_logit_diff <= g.parity.tolerance for g in m.graphs)  # bf16: near ties may flip
    with zipfile.ZipFile(bundle(NAME, *_options(lowering)) / "decode.pt2") as package:
        wrappers = [n for n in package.namelist() if n.endswith(".wrapper.cpp")]
        calls = [package.read(n).count(f"aoti_torch_cpu_{lowering}_linear(".encode()) for n in wrappers]
    assert len(wrappers) == 2 and all(c > 1 for c in calls)  # its declaration, then each linear


def test_a_left_padded_batch_past_the_window_equals_hf_in_bf16(lowered, hf_bf16):
    _, rt = lowered
    inputs = chat(rt.tokenizer, CONVERSATIONS)
    assert (inputs["attention_mask"] == 0).any()
    assert_parity(rt, hf_bf16, inputs, new_tokens=32)


def test_one_row_through_the_one_row_graph_equals_hf_in_bf16(lowered, hf_bf16):
    _, rt = lowered
    inputs = chat(rt.tokenizer, CONVERSATIONS[:1])
    assert_parity(rt, hf_bf16, inputs, new_tokens=32)
