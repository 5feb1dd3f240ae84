"""Speculative decoding through the engine, on the eager step (seconds; tests/bundle/test_verify_graphs.py
runs the compiled verify graphs): greedy tokens and logits equal HF `generate` in every text family and
the VLM, past the sliding window, whether drafts are accepted, partly accepted or rejected, beside rows
that do not draft; the rejection rule keeps a sampled distribution; and the policy that decides when a
verify step pays."""

from __future__ import annotations

import pytest
import torch
from helpers import (
    LOGIT_ATOL,
    ScriptedDrafter,
    assert_each_matches_lone_generate,
    lone_generate,
    staggered,
    verifying_whenever_drafted,
)

from runtime.engine.speculation import Drafter, StepCosts, draft_tokens, rejection_sample

FAMILIES = ["tiny-llama", "tiny-qwen3", "tiny-gemma3", "tiny-mistral", "tiny-gemma2"]
DRAFTS, NEW = 4, 40  # 40 tokens: 5 windows of 8
GREEDY = {"max_new_tokens": NEW, "min_new_tokens": NEW, "do_sample": False}


class Oracle(ScriptedDrafter):
    """Drafts the tokens plain decoding will choose (`truth`, (n,)), each wrong with probability `wrong`
    (seeded): accepted, partly accepted and rejected drafts in one request."""

    def __init__(self, truth: torch.Tensor, prompt: int, wrong: float, seed: int = 0):
        self.truth, self.prompt, self.wrong = truth, prompt, wrong
        self.rng = torch.Generator().manual_seed(seed)

    def propose(self, history: torch.Tensor, room: int):
        at = history.shape[1] - self.prompt
        drafts = self.truth[at : at + min(room, DRAFTS)].clone()
        flip = torch.rand(drafts.shape, generator=self.rng) < self.wrong
        drafts[flip] = (drafts[flip] + 1) % 300
        return drafts if drafts.numel() else None


def _prompt(length: int, seed: int) -> torch.Tensor:
    """A prompt that repeats itself, as text to be copied does: prompt lookup finds matches in it."""
    torch.manual_seed(seed)
    half = torch.randint(3, 300, (1, length // 2))
    return torch.cat([half, half], 1)


def _run(rt, ids, drafter=None, **options):
    """(new tokens (1, n), raw logits (1, n, vocab)) of one request through the engine."""
    request = rt.validator.request(ids, **(GREEDY | options))
    handle = rt.engine.submit(request, want_logits=True, drafter=drafter)
    steps = list(handle)
    return torch.stack([t for t, _ in steps], 1), torch.stack([lg for _, lg in steps], 1)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("wrong", [0.0, 0.3, 1.0])
def test_greedy_tokens_and_logits_equal_hf_whatever_the_drafts(eager_runtime, reference, name, wrong):
    rt = eager_runtime(name, rows=2, cache=96, drafts=DRAFTS)
    ids = _prompt(12, seed=1)
    ref_tokens, ref_logits = lone_generate(reference(name), {"input_ids": ids}, **GREEDY)
    oracle = Oracle(ref_tokens[0], ids.shape[1], wrong)
    with verifying_whenever_drafted(rt):
        tokens, logits = _run(rt, ids, oracle)
    assert torch.equal(tokens, ref_tokens)
    assert (logits - ref_logits).abs().max().item() < LOGIT_ATOL
    assert rt.engine.verify_steps > 0 and oracle.drafted > 0
    if wrong == 0.0:  # every draft right: about k + 1 tokens a verify step
        assert oracle.accepted == oracle.drafted and rt.engine.verify_steps <= NEW // DRAFTS + 2
    if wrong == 1.0:
        assert oracle.accepted == 0


def test_prompt_lookup_drafts_by_default_for_greedy_requests_and_not_when_turned_off(eager_runtime, reference):
    """Prompt lookup drafts from the repeating prompt (a random model rejects what it drafts, so the
    drafter soon rests: the Oracle above exercises acceptance), and the tokens are still HF's.
    `prompt_lookup_num_tokens=0` or `speculation=False` turns drafting off."""
    name = "tiny-gemma3"
    rt = eager_runtime(name, rows=2, cache=96, drafts=DRAFTS)
    ids = _prompt(12, seed=2)
    ref_tokens, _ = lone_generate(reference(name), {"input_ids": ids}, **GREEDY)
    tokens, _ = _run(rt, ids)
    assert torch.equal(tokens, ref_tokens)
    assert rt.engine.drafted > 0 and rt.engine.verify_steps < NEW // 2  # it rested after failing
    before = rt.engine.verify_steps
    assert torch.equal(_run(rt, ids, prompt_lookup_num_tokens=0)[0], ref_tokens)
    assert rt.engine.verify_steps == before
    off = eager_runtime(name, rows=2, cache=96, drafts=DRAFTS, speculation=False)
    assert torch.equal(_run(off, ids)[0], ref_tokens) and off.engine.verify_steps == 0


def test_drafting_and_plain_requests_share_verify_steps_and_each_matches_hf(eager_runtime, reference):
    """Continuous batching: a drafting request, a left-padded two-row request (which never drafts) and a
    sampled one join one after another; each equals HF's generate alone."""
    name = "tiny-gemma3"
    rt = eager_runtime(name, rows=4, cache=96, drafts=DRAFTS)
    pair = torch.randint(3, 300, (2, 9))
    mask = torch.ones_like(pair)
    mask[1, :3] = 0
    plan = [
        ({"input_ids": _prompt(12, seed=3)}, GREEDY, None),
        ({"input_ids": pair, "attention_mask": mask}, GREEDY | {"max_new_tokens": 24, "min_new_tokens": 24}, None),
        ({"input_ids": _prompt(10, seed=4)}, {"max_new_tokens": 20, "do_sample": True, "top_k": 30}, 7),
    ]
    submit = lambda inputs, generator, **o: rt.submit(**inputs, generator=generator, want_logits=True, **o)  # noqa: E731
    assert_each_matches_lone_generate(reference(name), plan, staggered(submit, plan))
    assert rt.engine.verify_steps > 0


def test_a_vlm_request_with_an_image_drafts_and_matches_hf(eager_runtime, reference):
    from helpers import chat
    from PIL import Image

    name = "tiny-gemma3-vlm"
    rt = eager_runtime(name, rows=1, cache=160, drafts=DRAFTS)
    messages = [[{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (32, 32), (9, 90, 200))},
                                              {"type": "text", "text": "Describe the image."}]}]]  # fmt: skip
    inputs = chat(rt, messages)
    ref_tokens, ref_logits = lone_generate(reference(name), inputs, **GREEDY)
    tokens = torch.stack([t for t, _ in rt.iter_steps(**inputs, **GREEDY)], 1)
    assert torch.equal(tokens, ref_tokens) and rt.engine.verify_steps > 0


def test_the_rejection_rule_keeps_the_sampling_distribution():
    probs = torch.tensor([[0.05, 0.4, 0.25, 0.2, 0.1]])
    generator = torch.Generator().manual_seed(0)
    for draft in (1, 4):  # a likely draft and an unlikely one
        draws = torch.cat([rejection_sample(probs, draft, generator) for _ in range(20000)])
        freq = torch.bincount(draws, minlength=5).float() / draws.numel()
        torch.testing.assert_close(freq, probs[0], atol=0.012, rtol=0)


def test_sampled_requests_draft_only_when_asked_and_never_past_the_bundles_k():
    assert draft_tokens(None, 4, sampled=False) == 4 and draft_tokens(None, 4, sampled=True) == 0
    assert draft_tokens(2, 4, sampled=True) == 2 and draft_tokens(9, 4, sampled=False) == 4
    assert draft_tokens(0, 4, sampled=False) == 0 and draft_tokens(3, 0, sampled=False) == 0


def test_a_declined_drafter_keeps_drafting_and_learns_from_what_decoding_gives():
    """Declined drafts are scored against the tokens decoded next, as a verify step would have taken them:
    a request whose copies fail loses the engine's confidence without a wasted verify step, and regains it
    when its drafts start to come true."""
    drafter = Drafter(4, 2)
    history = torch.tensor([[5, 6, 7, 8, 5, 6]])
    assert drafter.propose(history, 4).tolist() == [7, 8, 5, 6]
    # only after a match of two tokens: a single one (transformers' fallback) predicts little
    assert drafter.propose(torch.tensor([[5, 6, 7, 8, 9, 6]]), 4) is None
    assert drafter.expected(4) == pytest.approx(1 + 4 * 0.7)
    drafts = drafter.propose(history, 4)
    drafter.declined(drafts, history.shape[1])
    drafter.declined(torch.tensor([1, 2]), history.shape[1])  # one shadow at a time: ignored
    after = torch.cat([history, torch.tensor([[7, 9]])], 1)  # decoding took 7, then 9 where 8 was drafted
    assert drafter.propose(after[:, :-1], 4) is not None and drafter.acceptance == pytest.approx(0.7)  # unknown yet
    drafter.propose(after, 4)  # 1 of 4 would have been taken
    assert drafter.acceptance == pytest.approx(0.7 * 0.7 + 0.3 * 0.25)
    assert (drafter.drafted, drafter.accepted) == (0, 0)  # the metrics count verified drafts only
    text = list(range(10, 70))
    ids = torch.tensor([text + text[:2]])
    for _ in range(32):  # now decoding copies `text`: every shadow comes true
        drafts = drafter.propose(ids, 4)
        drafter.declined(drafts, ids.shape[1])
        ids = torch.cat([ids, torch.tensor([[text[ids.shape[1] - len(text)]]])], 1)
    assert drafter.acceptance > 0.9
    before = drafter.acceptance
    drafter.record(4, 0)  # a verify step that took none
    assert drafter.acceptance == pytest.approx(0.7 * before) and (drafter.drafted, drafter.accepted) == (4, 0)


def test_a_verify_step_runs_only_when_its_expected_tokens_beat_the_decode_steps_rate():
    costs = StepCosts()
    assert costs.pays(1, 1, rows=1, expected=1.5)  # unmeasured: try it
    costs.seconds = {("decode", 1): 0.010, ("verify", 1): 0.022}
    assert costs.pays(1, 1, rows=1, expected=3.0) and not costs.pays(1, 1, rows=1, expected=2.0)


class Fixed(ScriptedDrafter):
    """Always drafts the same tokens."""

    def __init__(self, drafts: list[int]):
        self.drafts = torch.tensor(drafts)

    def propose(self, history, room):
        return self.drafts[:room] if room else None


def test_sampling_through_verify_steps_draws_the_models_own_distribution(eager_runtime):
    """Chi-square over 400 seeded short runs of a tiny model: the first sampled token of a request whose
    every step verifies drafts (one likely draft, one unlikely) follows softmax(logits / T) over the top k
    exactly as plain sampling does (the statistic against HF's own warpers' probabilities)."""
    rt = eager_runtime("tiny-llama", rows=1, cache=32, drafts=DRAFTS)
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    options = {"max_new_tokens": 2, "do_sample": True, "top_k": 5, "temperature": 1.3}
    request = rt.validator.request(ids, **options)
    with torch.inference_mode():
        logits = rt.model(ids).logits[:, -1].float()  # (1, vocab)
    probs = torch.softmax(request.processors(ids, logits), -1)[0]  # HF's warpers: top 5 at T = 1.3
    top = probs.topk(5).indices
    draft = [int(top[0]), int(top[4])]
    counts = torch.zeros(5)
    generator = torch.Generator().manual_seed(0)
    with verifying_whenever_drafted(rt):
        for _ in range(400):
            request = rt.validator.request(ids, generator=generator, **options)
            first = int(rt.engine.submit(request, drafter=Fixed(draft)).result()[0, ids.shape[1]])
            counts[(top == first).nonzero()[0, 0]] += 1
    assert rt.engine.verify_steps >= 400
    expected = probs[top] / probs[top].sum() * counts.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.47, (counts.tolist(), expected.tolist())  # df 4, p = 0.001
