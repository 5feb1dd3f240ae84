"""Speculative decoding in a bundle: `--speculate 3` compiles a verify graph beside the decode graph,
checked at export, sharing the weights and the cache; through it, greedy tokens and logits equal HF
`generate` past the sliding window with drafts right, partly right and wrong, beside requests that do
not draft; and bad verify inputs are refused before native code runs. Its float weights are read by
aotpack's dense GEMM (`--gemv dense`: 4 rows in the decode graph, 16 in the verify graph), so these
parity tests are that kernel's too."""

from __future__ import annotations

import pytest
import torch
from helpers import (
    LOGIT_ATOL,
    ScriptedDrafter,
    assert_each_matches_lone_generate,
    graphs_stepped,
    lone_generate,
    staggered,
    verifying_whenever_drafted,
)

from runtime.errors import InvalidInputError

NAME = "tiny-gemma3"  # sliding window 8 beside full layers
DRAFTS = 3
OPTIONS = ("--gemv", "dense", "--speculate", str(DRAFTS), "--batch-buckets", "4")
GREEDY = {"max_new_tokens": 40, "min_new_tokens": 40, "do_sample": False}  # 5 windows


@pytest.fixture(scope="module")
def rt(runtime):
    return runtime(NAME, *OPTIONS)


class Oracle(ScriptedDrafter):
    """Drafts the tokens HF chooses (`truth` (n,)), every third one wrong."""

    def __init__(self, truth: torch.Tensor, prompt: int):
        self.truth, self.prompt, self.calls = truth, prompt, 0

    def propose(self, history, room):
        at, self.calls = history.shape[1] - self.prompt, self.calls + 1
        drafts = self.truth[at : at + room].clone()
        if self.calls % 3 == 0 and drafts.numel() > 1:
            drafts[1] = (drafts[1] + 1) % 300
        return drafts if drafts.numel() else None


def test_the_bundle_has_a_verify_graph_checked_at_export_and_rings_with_room_for_drafts(rt):
    m = rt.manifest
    assert m.draft_tokens == DRAFTS and m.batches == (4,) and m.verify_batches == (4,)
    verify = next(g for g in m.graphs if g.tokens == DRAFTS + 1)
    assert verify.parity.tokens_match and verify.parity.steps > 0
    assert all(layer.slots == layer.window + DRAFTS for layer in m.cache_layout if layer.window)


def test_the_graphs_call_the_dense_gemm_the_bundle_carries(rt):
    """Every float weight of both graphs is read by aotpack's GEMM, from the kernels.so listed in the
    manifest (a float bundle carries it only when a graph calls it)."""
    m = rt.manifest
    assert {lw.chosen for g in m.graphs for lw in g.lowerings} == {"dense"}
    assert m.native is not None and m.native.file in m.files and m.quantization is None


def test_drafted_greedy_decoding_equals_hf_through_the_compiled_verify_graph(rt, reference):
    torch.manual_seed(5)
    ids = torch.randint(3, 300, (1, 10))
    ref_tokens, ref_logits = lone_generate(reference(NAME), {"input_ids": ids}, **GREEDY)
    oracle = Oracle(ref_tokens[0], ids.shape[1])
    verified = []
    with graphs_stepped(rt, verified), verifying_whenever_drafted(rt):
        request = rt.validator.request(ids, **GREEDY)
        steps = list(rt.engine.submit(request, want_logits=True, drafter=oracle))
    tokens, logits = torch.stack([t for t, _ in steps], 1), torch.stack([lg for _, lg in steps], 1)
    assert torch.equal(tokens, ref_tokens)
    assert (logits - ref_logits).abs().max().item() < LOGIT_ATOL
    assert set(verified) == {4} and 0 < oracle.accepted < GREEDY["max_new_tokens"]


def test_drafting_plain_and_sampled_requests_share_steps_and_each_matches_hf(rt, reference):
    """Prompt lookup drafts for the greedy one-row requests (a repeating prompt); the two-row request
    and the sampled one do not draft; all join one after another."""
    torch.manual_seed(6)
    half = torch.randint(3, 300, (1, 6))
    pair = torch.randint(3, 300, (2, 9))
    mask = torch.ones_like(pair)
    mask[1, :2] = 0
    plan = [
        ({"input_ids": torch.cat([half, half], 1)}, GREEDY, None),
        ({"input_ids": pair, "attention_mask": mask}, {"max_new_tokens": 20, "min_new_tokens": 20}, None),
        ({"input_ids": torch.cat([half, half, half], 1)}, {"max_new_tokens": 16, "do_sample": True}, 3),
    ]
    before = rt.engine.drafted
    submit = lambda inputs, generator, **o: rt.submit(**inputs, generator=generator, want_logits=True, **o)  # noqa: E731
    assert_each_matches_lone_generate(reference(NAME), plan, staggered(submit, plan))
    assert rt.engine.drafted > before


def _verify_inputs(rt, index: int, tokens: int = DRAFTS + 1):
    rows, length = 4, rt.manifest.max_cache_len
    pad = torch.zeros(rows, length, dtype=torch.bool)
    pad[:, : index + tokens] = True
    position = torch.full((rows, tokens), index) + torch.arange(tokens)
    kv = [torch.zeros_like(t) for t in rt.kv]
    return torch.ones(rows, tokens, dtype=torch.long), position, torch.full((rows,), index), pad, kv


def test_verify_inputs_the_graph_would_misread_are_refused(rt):
    """A row's drafts past the attended span (AOTInductor would write past the cache), and a number of
    tokens no graph takes, fail with a message before native code runs."""
    ids, position, index, pad, kv = _verify_inputs(rt, 10)
    with pytest.raises(InvalidInputError, match="with its 3 drafts after it"):
        rt.decode(ids, position, index, pad[:, :12].contiguous(), kv)
    with pytest.raises(InvalidInputError, match="take 1 or 4"):
        rt.decode(ids[:, :3].contiguous(), position[:, :3].contiguous(), index, pad, kv)
    assert rt.decode(ids, position, index, pad, kv).shape == (4, DRAFTS + 1, rt.manifest.vocab_size)
