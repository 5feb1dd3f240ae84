"""bf16 weights on AMX tiles in a bundle (`--dtype bfloat16 --gemv tiles`: aotpack's kernel,
exporter/csrc/dense.cpp): every graph calls it through its C shim, the bundle carries kernels built for
the `amx` path, and greedy tokens equal HF's bf16 `generate` (logits within the bf16 parity tolerance): a
left-padded batch far past the sliding window through the 4-row graph, one row through the 1-row graph.
Skipped on a CPU without AMX's bf16 tiles. The kernel itself: tests/unit/test_tiles_kernel.py."""

from __future__ import annotations

import zipfile

import pytest
import torch
from helpers import assert_parity, chat, isa_library

NAME = "tiny-gemma3"  # sliding window 8 beside full layers
OPTIONS = ("--dtype", "bfloat16", "--gemv", "tiles", "--batch-buckets", "1,4")
CONVERSATIONS = [
    [{"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Say hi."}],
]


@pytest.fixture(scope="module")
def rt(runtime):
    if not isa_library("amx").tiles:
        pytest.skip("Linux did not grant this process AMX's tile state")
    return runtime(NAME, *OPTIONS)


@pytest.fixture(scope="module")
def hf_bf16(reference, rt):
    return reference(NAME).to(torch.bfloat16)


def test_every_graph_multiplies_on_tiles_from_the_kernels_the_bundle_carries(rt, bundle):
    m = rt.manifest
    assert {lw.chosen for g in m.graphs for lw in g.lowerings} == {"tiles"} and m.batches == (1, 4)
    assert m.native is not None and m.native.isa == "amx" and m.dtype == "bfloat16"
    assert all(g.parity.max_abs_logit_diff <= g.parity.tolerance for g in m.graphs)  # bf16: near ties may flip
    with zipfile.ZipFile(bundle(NAME, *OPTIONS) / "decode.pt2") as package:
        wrappers = [n for n in package.namelist() if n.endswith(".wrapper.cpp")]
        calls = [package.read(n).count(b"aoti_torch_cpu_tiles_linear(") for n in wrappers]
    assert len(wrappers) == 2 and all(c > 1 for c in calls)  # its declaration, then each linear


def test_a_left_padded_batch_past_the_window_equals_hf_in_bf16(rt, hf_bf16):
    inputs = chat(rt.tokenizer, CONVERSATIONS)
    assert (inputs["attention_mask"] == 0).any()
    assert_parity(rt, hf_bf16, inputs, new_tokens=32)


def test_one_row_through_the_one_row_graph_equals_hf_in_bf16(rt, hf_bf16):
    inputs = chat(rt.tokenizer, CONVERSATIONS[:1])
    assert_parity(rt, hf_bf16, inputs, new_tokens=32)
