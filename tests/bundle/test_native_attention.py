"""The native decode attention in a bundle (`--decode-attention native`: aotpack's kernel,
exporter/csrc/attention.cpp): the graphs call it through its C shim, the bundle carries the kernels, and
greedy tokens and logits equal HF `generate`: a left-padded batch far past the sliding window, one row
beside others at other positions, and prompts going in through the chunk graph (4 tokens a row per call,
the kernel's several-tokens-a-row path). The kernel itself against fp64: tests/unit/test_attention_kernel.py.
"""

from __future__ import annotations

import zipfile

import torch
from helpers import GREEDY, SAMPLED, assert_each_matches_lone_generate, assert_parity, chat, staggered, submitter

NAME = "tiny-gemma3"  # sliding window 8 beside full layers, 4 query heads over 1 KV head
OPTIONS = ("--gemv", "aten", "--decode-attention", "native", "--chunk-graph", "4")
CONVERSATIONS = [
    [{"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Say hi."}],
]


def test_every_graph_calls_the_native_attention_and_the_bundle_carries_its_kernels(runtime, bundle):
    rt = runtime(NAME, *OPTIONS)
    m = rt.manifest
    assert m.decode_attention.chosen == "native" and m.decode_attention.us_per_call == {}  # named: untimed
    assert m.native is not None and (bundle(NAME, *OPTIONS) / m.native.file).is_file()
    assert all(g.parity.tokens_match for g in m.graphs) and len(m.graphs) == 2  # the decode and chunk graphs
    with zipfile.ZipFile(bundle(NAME, *OPTIONS) / "decode.pt2") as package:
        wrappers = [n for n in package.namelist() if n.endswith(".wrapper.cpp")]
        calls = [package.read(n).count(b"aoti_torch_cpu_decode_attention(") for n in wrappers]
    layers = rt.model.config.get_text_config().num_hidden_layers
    assert len(wrappers) == 2 and calls == [layers + 1] * 2  # its declaration, then one call a layer


def test_a_left_padded_batch_past_the_window_equals_hf(runtime, reference):
    rt = runtime(NAME, *OPTIONS)
    inputs = chat(rt.tokenizer, CONVERSATIONS)
    assert (inputs["attention_mask"] == 0).any()
    assert_parity(rt, reference(NAME), inputs, new_tokens=48)


def test_rows_at_other_positions_and_prompts_in_chunks_equal_hf(runtime):
    rt = runtime(NAME, *OPTIONS)
    g = torch.Generator().manual_seed(5)
    prompts = [{"input_ids": torch.randint(3, 300, (1, n), generator=g)} for n in (5, 30, 11)]
    plan = [(prompts[0], GREEDY, None), (prompts[1], SAMPLED, 7), (prompts[2], GREEDY, None)]
    rt.engine.chunk_prefills(8)
    try:
        results = staggered(submitter(rt), plan)
    finally:
        rt.engine.chunk_prefills(None)
    assert_each_matches_lone_generate(rt.model, plan, results)
