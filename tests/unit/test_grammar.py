"""Structured output through llguidance, in seconds: the eager runtime (no compile) held to a JSON schema,
a regex and a list of choices by `rt.constrain`, sampled with several seeds; and the refusals (the
served 20-of-20 test: tests/serve/test_serve.py)."""

from __future__ import annotations

import functools
import json
import re

import jsonschema
import pytest
import torch
from helpers import JSON_SCHEMA as SCHEMA

from runtime.errors import InvalidInputError


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
