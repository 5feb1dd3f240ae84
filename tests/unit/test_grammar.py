"""Structured output through llguidance, in seconds: the eager runtime (no compile) held to a JSON schema,
a regex and a list of choices by `rt.constrain`, sampled with several seeds; and the refusals (the
served 20-of-20 test: tests/serve/test_serve.py)."""

from __future__ import annotations

import functools
import json
import re

import jsonschema
import numpy as np
import pytest
import torch
from helpers import JSON_SCHEMA as SCHEMA
from transformers.generation import LogitsProcessorList
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from runtime.engine.sampling import (
    at_top_k,
    probabilities,
    survivors_distribution,
    top_k_and_next,
    top_k_distribution,
)
from runtime.errors import InvalidInputError
from runtime.generation.grammar import GrammarProcessor, _pooled


@pytest.fixture(scope="module")
def rt(eager_runtime):
    return eager_runtime("tiny-llama", rows=4, cache=64)


@functools.cache
def _prompt():
    return torch.tensor([[2, 40, 41, 42, 43]])  # (1, 5)


def _sampled(rt, seed: int, *constraint, **options) -> str:
    processors = [rt.constrain(*constraint)] if constraint else []
    generator = torch.Generator().manual_seed(seed)
    ids = rt.generate(
        _prompt(), do_sample=True, generator=generator, max_new_tokens=32, logits_processor=processors, **options
    )
    return rt.tokenizer.decode(ids[0, _prompt().shape[1] :], skip_special_tokens=True)


def test_a_random_model_held_to_a_schema_writes_valid_json_every_time(rt):
    for seed in range(8):
        jsonschema.validate(json.loads(_sampled(rt, seed, "json_schema", SCHEMA)), SCHEMA)


def test_without_the_constraint_the_same_model_writes_no_such_json(rt):
    """What makes the test above mean something: unconstrained, not one of the 8 parses."""

    def parses(text: str) -> bool:
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True

    assert not any(parses(_sampled(rt, seed)) for seed in range(8))


def test_a_regex_a_choice_and_any_json_object(rt):
    for seed in range(3):
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", _sampled(rt, seed, "regex", r"[0-9]{3}-[a-z]{2}"))
        assert _sampled(rt, seed, "choice", ["yes", "no", "maybe"]) in ("yes", "no", "maybe")
    # any JSON object is unbounded (a key can run on): a reply that ended before its budget is a whole one
    for seed in range(4):
        out = rt.generate(
            _prompt(), do_sample=True, generator=torch.Generator().manual_seed(seed), max_new_tokens=48,
            logits_processor=[rt.constrain("json_schema", True)], return_dict_in_generate=True,
        )  # fmt: skip
        text = rt.tokenizer.decode(out.sequences[0, 5:], skip_special_tokens=True)
        assert text.startswith("{") and (out.finish_reasons[0] == "length" or isinstance(json.loads(text), dict))


def test_a_format_llguidance_cannot_compile_is_refused_before_generating(rt):
    with pytest.raises(InvalidInputError, match="the output format cannot be used: .*nonsense"):
        rt.constrain("json_schema", {"type": "nonsense"})
    with pytest.raises(InvalidInputError, match="choice cannot be"):
        rt.constrain("choice", [])


def test_without_llguidance_the_message_names_the_extra(rt, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_llguidance(name, *args, **kwargs):
        if name.startswith("llguidance"):
            raise ImportError(f"No module named {name!r}", name=name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_llguidance)
    with pytest.raises(InvalidInputError, match=r"needs llguidance .*pip install 'aotpack\[grammar\]'"):
        rt.constrain("regex", "a+")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [64, 100, 257])
def test_the_masks_bits_ban_exactly_the_tokens_llguidance_leaves_out(vocab, dtype):
    """Each row's bitmask (a bit per allowed token, lowest first, 32 to a little-endian int32, the last
    word partly past the vocabulary) sets exactly its disallowed scores to -inf, in place, whatever the
    scores' dtype (bf16 takes torch's masked_fill_, float32 NumPy's masked copy)."""
    from runtime.generation.grammar import _banned, _forbid

    g = torch.Generator().manual_seed(vocab)
    words = (vocab + 31) // 32
    allowed = torch.rand(3, words * 32, generator=g) < 0.4  # (rows, words * 32); bits past vocab are noise
    packed = (allowed.view(3, words, 32).long() << torch.arange(32)).sum(-1).to(torch.int64)  # (rows, words)
    bitmasks = [row.to(torch.int64).numpy().astype("<u4").tobytes() for row in packed]
    scores = torch.randn(3, vocab, generator=g).to(dtype)
    before = scores.clone()
    out = _forbid(scores, _banned(bitmasks, vocab))
    assert out.data_ptr() == scores.data_ptr()
    expected = before.masked_fill(~allowed[:, :vocab], float("-inf"))
    assert torch.equal(out, expected)


def test_a_grammar_allows_exactly_the_tokens_its_mask_lets_through(rt):
    """`allows` (the check a greedy row makes before any mask is applied) agrees with the mask on every
    token of the vocabulary, step after step along a sampled path to the grammar's end, the end of
    sequence included where the grammar may end or go on (the regex), and once stopped (eos only)."""
    vocab, g = rt.validator.vocab_size, torch.Generator().manual_seed(0)
    constraints = [("json_schema", {"type": "object", "properties": {"note": {"type": "string"}}}),
                   ("choice", ["yes", "no"]), ("regex", r"[a-z]{1,12}")]  # fmt: skip
    for constraint in constraints:
        processor, history, ends = rt.constrain(*constraint), _prompt(), 0
        while True:
            allowed = torch.isfinite(processor(history, torch.zeros(1, vocab)))[0]  # (vocab,)
            assert [processor.allows(history, torch.tensor([t])) for t in range(vocab)] == allowed.tolist()
            if processor.matchers[0].is_stopped():
                assert allowed.nonzero().flatten().tolist() == [rt.tokenizer.eos_token_id]
                break
            ends += bool(allowed[rt.tokenizer.eos_token_id])
            choices = allowed.nonzero().flatten()
            token = choices[torch.randint(len(choices), (1,), generator=g)]  # (1,)
            history = torch.cat([history, token[None]], dim=-1)
        assert ends or constraint[0] != "regex"  # the regex's path met a state that may end or go on


def test_an_argmax_that_splits_forced_text_is_masked_as_the_mask_says(rt):
    """Where the grammar forces bytes, its mask holds their canonical first token only (`co` of
    `"color"`), and llguidance's validate_tokens would take a shorter split too (`c`). A processor
    before the grammar lifts such a split to the top wherever one exists: the check reads the mask, so
    the tokens stay those of the masked path, and the run meets such steps."""
    from runtime.generation.grammar import _lets_through

    class LiftSplits:
        def __init__(self, grammar):
            self.grammar, self.lifted = grammar, 0

        def __call__(self, input_ids, scores):
            self.grammar._follow(input_ids)
            mask, matcher = self.grammar._bitmasks()[0], self.grammar.matchers[0]
            splits = [t for t in range(scores.shape[-1]) if not _lets_through(mask, t) and matcher.validate_tokens([t])]
            if splits:
                scores[0, splits[0]] = scores.max() + 1
                self.lifted += 1
            return scores

    def tokens(**options):
        grammar = rt.constrain("json_schema", SCHEMA)
        lift = LiftSplits(grammar)
        out = rt.generate(
            _prompt(), max_new_tokens=20, do_sample=False, return_dict_in_generate=True,
            logits_processor=[lift, grammar], **options,
        )  # fmt: skip
        return out.sequences, lift.lifted

    (checked, lifted), (masked, _) = tokens(), tokens(output_scores=True)
    assert torch.equal(checked, masked) and lifted


def test_a_row_that_a_stop_string_ends_leaves_the_grammar_of_the_others_alone(rt):
    """A finished row takes the pad id from then on, which its grammar need not allow: the grammar stops
    following it, and the other row decodes on under its own grammar."""
    x = rt.tokenizer.convert_tokens_to_ids("x")

    def first_row_writes_x(input_ids, scores):
        scores[0, x] = scores.max() + 1
        return scores

    prompts = torch.tensor([[2, 40, 41, 42, 43], [2, 50, 51, 52, 53]])  # (2, 5)
    for options in ({"do_sample": False}, {"do_sample": False, "output_scores": True}):
        out = rt.generate(
            prompts, max_new_tokens=8, stop_strings=["x"], return_dict_in_generate=True,
            logits_processor=[first_row_writes_x, rt.constrain("regex", "[a-z ]{1,60}")], **options,
        )  # fmt: skip
        first, second = (rt.tokenizer.decode(row[5:], skip_special_tokens=True) for row in out.sequences)
        assert first == "x" and out.finish_reasons[0] == "stop_string"
        assert re.fullmatch("[a-z ]{1,60}", second) and out.finish_reasons[1] == "length"


def _bitmask(allowed: torch.Tensor) -> bytes:
    """A (vocab,) bool as llguidance's bitmask: a bit per token, lowest first, 32 to a little-endian word."""
    words = (allowed.shape[0] + 31) // 32
    padded = torch.zeros(words * 32, dtype=torch.bool)
    padded[: allowed.shape[0]] = allowed
    return np.packbits(padded.numpy(), bitorder="little").tobytes()


@pytest.mark.parametrize("vocab", [262_144, 1000])
@pytest.mark.parametrize("k", [5, 64])
@pytest.mark.parametrize("kind", ["most", "half", "few", "exactly k", "k + 1", "one", "ties"])
def test_the_top_k_a_pool_gives_under_a_mask_is_the_whole_masked_vocabularys(vocab, k, kind):
    """The sampled rows' shortcut (grammar._pooled): the masked scores' k + 1 highest read from the raw
    scores' 2(k + 1) highest and the mask at those tokens give the survivors a topk over the whole masked
    vocabulary gives (the same tokens, the same probabilities), or no answer (the caller masks the whole
    vocabulary): with most tokens allowed (inside a JSON string), half, fewer than k, exactly k or k + 1
    (the -inf survivors padded), one (a forced token), and tied scores (the pool cannot tell)."""
    g = torch.Generator().manual_seed(vocab + k)
    scores = torch.randn(3, vocab, generator=g) * 3  # (B, vocab)
    if kind == "ties":
        scores = torch.randint(0, 12, (3, vocab), generator=g).float()
    density = {"most": 0.97, "half": 0.5, "ties": 0.97}.get(kind, 0.0)
    allowed = torch.rand(3, vocab, generator=g) < density  # (B, vocab)
    for row in range(3):
        count = {"few": 3, "exactly k": k, "k + 1": k + 1, "one": 1}.get(kind)
        if count is not None:
            allowed[row, torch.randperm(vocab, generator=g)[:count]] = True
    warpers = LogitsProcessorList([TopKLogitsWarper(k), TopPLogitsWarper(0.9)])
    _, k, rest = at_top_k(warpers)
    history = torch.zeros(1, 4, dtype=torch.long)
    values, indices = top_k_and_next(scores, 2 * k + 1)  # (B, 2(k + 1)) each: the raw pool
    answered = 0
    for row in range(3):
        masked = scores[row : row + 1].masked_fill(~allowed[row], float("-inf"))  # (1, vocab)
        expected = top_k_distribution(masked, k, rest, history)
        pooled = _pooled(_bitmask(allowed[row]), scores[row], values[row], indices[row], k + 1)
        if pooled is None:
            assert kind in ("half", "k + 1", "ties")  # the pool may not hold their k + 1 highest
            continue
        answered += 1
        got = survivors_distribution(pooled[0][None], pooled[1][None], k, rest, history)
        assert (got is None) == (expected is None)  # a tie at the k-th score: HF's path either way
        if got is not None:
            full = [torch.zeros(vocab).scatter(0, i[0], p[0]) for i, p in (got, expected)]
            torch.testing.assert_close(full[0], full[1], rtol=1e-6, atol=0)
            assert set(full[0].nonzero().flatten().tolist()) <= set(allowed[row].nonzero().flatten().tolist())
            assert torch.equal(full[0], full[1]) or kind != "most"  # no -inf survivor: the very same numbers
            hf = probabilities(warpers(history, masked.clone()))[0]  # HF's warpers over the whole vocabulary
            torch.testing.assert_close(full[0], hf, rtol=1e-5, atol=1e-7)
    assert answered or kind in ("half", "k + 1", "ties")


def test_sampled_rows_under_a_grammar_take_the_pools_survivors_along_real_runs(rt, monkeypatch):
    """The top-k sampler under a grammar (serve's default): at every step of real runs (one row, and a
    two-row batch), the survivors the pool gave are those of the whole masked vocabulary (checked in
    place); the pool answers most steps, and every reply validates against the schema. Every third call
    is refused, as a pool that cannot tell is, so the whole-vocabulary path takes turns with the pool on
    one grammar; the raw logits a caller keeps stay unmasked either way."""
    _, k, rest = at_top_k(LogitsProcessorList([TopKLogitsWarper(8), TopPLogitsWarper(0.95)]))
    real, steps = GrammarProcessor.top_allowed, []

    def checked(self, input_ids, scores, values, indices, n):
        assert n == k + 1 and values.shape[-1] >= 2 * (k + 1)
        pooled = real(self, input_ids, scores, values, indices, n)
        expected = top_k_distribution(self(input_ids, scores.clone()), k, rest, input_ids)  # the whole vocabulary
        steps.append(pooled is not None)
        got = None if pooled is None else survivors_distribution(*pooled, k, rest, input_ids)
        assert got is None or expected is not None
        if got is not None:  # -inf survivors (fewer than k allowed) go last: the same tokens and probabilities
            finite = got[1] > 0
            assert torch.equal(got[0][finite], expected[0][expected[1] > 0]) and torch.equal(got[1], expected[1])
        return None if len(steps) % 3 == 0 else pooled

    monkeypatch.setattr(GrammarProcessor, "top_allowed", checked)
    prompts = [_prompt(), torch.cat([_prompt(), _prompt() + 7])]  # (1, 5), (2, 5)
    for seed, prompt in enumerate(prompts * 3):
        grammar = rt.constrain("json_schema", SCHEMA)
        handle = rt.submit(
            prompt, do_sample=True, top_k=8, top_p=0.95, sampler="top-k", max_new_tokens=40, want_logits=True,
            generator=torch.Generator().manual_seed(seed), logits_processor=[grammar],
        )  # fmt: skip
        tokens, logits = zip(*handle, strict=True)
        assert all(bool(torch.isfinite(step).all()) for step in logits)  # (b, vocab) each: raw
        for row in torch.stack(tokens, dim=-1):
            jsonschema.validate(json.loads(rt.tokenizer.decode(row, skip_special_tokens=True)), SCHEMA)
    assert len(steps) > 60 and sum(steps) > len(steps) / 2, steps


def test_a_tie_the_pool_cannot_see_is_left_to_hfs_path():
    """Exactly k allowed tokens in the pool and one more outside it, tied with the k-th: HF keeps all
    k + 1, so neither path may take k survivors (the pool answers only with k + 1 allowed tokens in it)."""
    vocab, k = 1000, 5
    scores = -torch.arange(vocab, dtype=torch.float32)  # (vocab,): token t scores -t, distinct
    allowed = torch.zeros(vocab, dtype=torch.bool)
    allowed[[0, 2, 4, 6, 11]] = True  # the pool of 2(k + 1) = 12 holds these 5
    scores[500], allowed[500] = scores[11], True  # outside the pool, tied with the 5th allowed
    warpers = LogitsProcessorList([TopKLogitsWarper(k)])
    _, k, rest = at_top_k(warpers)
    history = torch.zeros(1, 4, dtype=torch.long)
    values, indices = top_k_and_next(scores[None], 2 * k + 1)
    masked = scores[None].masked_fill(~allowed, float("-inf"))
    assert top_k_distribution(masked, k, rest, history) is None  # a tie at the k-th score: HF's path
    assert _pooled(_bitmask(allowed), scores, values[0], indices[0], k + 1) is None


def test_tied_scores_among_few_allowed_tokens_keep_the_tokens_hfs_path_keeps():
    """Fewer than k tokens allowed, all tied, and top-p cutting through the tie: the pool pads its k + 1
    with other -inf tokens than a topk of the masked scores has, and the survivors put those last, so
    top-p's sort meets the tied tokens in the same places and keeps the same ones."""
    vocab, k = 200, 50
    scores = torch.zeros(vocab)
    allowed = torch.zeros(vocab, dtype=torch.bool)
    allowed[10:90:10] = True  # 8 tokens, tied
    _, k, rest = at_top_k(LogitsProcessorList([TopKLogitsWarper(k), TopPLogitsWarper(0.5)]))
    history = torch.zeros(1, 1, dtype=torch.long)
    expected = top_k_distribution(scores[None].masked_fill(~allowed, float("-inf")), k, rest, history)
    values, indices = top_k_and_next(scores[None], 2 * k + 1)
    pooled = _pooled(_bitmask(allowed), scores, values[0], indices[0], k + 1)
    got = survivors_distribution(pooled[0][None], pooled[1][None], k, rest, history)
    assert torch.equal(got[1], expected[1])
    assert torch.equal(got[0][got[1] > 0], expected[0][expected[1] > 0])  # the same 4 of the 8
    assert len(got[0][got[1] > 0]) < 8


def test_a_k_past_the_vocabulary_pools_the_whole_of_it():
    vocab, k = 40, 100
    scores = torch.randn(vocab, generator=torch.Generator().manual_seed(0))
    allowed = torch.rand(vocab, generator=torch.Generator().manual_seed(1)) < 0.5
    _, k, rest = at_top_k(LogitsProcessorList([TopKLogitsWarper(k)]))
    history = torch.zeros(1, 1, dtype=torch.long)
    values, indices = top_k_and_next(scores[None], 2 * k + 1)  # (1, vocab) each
    pooled = _pooled(_bitmask(allowed), scores, values[0], indices[0], k + 1)
    got = survivors_distribution(pooled[0][None], pooled[1][None], k, rest, history)
    expected = top_k_distribution(scores[None].masked_fill(~allowed, float("-inf")), k, rest, history)
    assert torch.equal(got[1], expected[1]) and torch.equal(got[0][got[1] > 0], expected[0][expected[1] > 0])
