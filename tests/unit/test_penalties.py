"""OpenAI's penalties and logit_bias on the logits: the processor against OpenAI's formula written out,
and the server's fields as generate() options (HF's own sequence_bias for the bias)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from runtime.errors import InvalidInputError
from runtime.generation.options import check_options
from runtime.generation.penalties import AdditivePenalties
from runtime.serve.completion import generate_options
from runtime.serve.schema import ChatRequest

PROMPT = 5


def _openai(scores, generated, frequency, presence):
    """OpenAI's documented formula, token by token: mu[j] - c[j] * frequency - (c[j] > 0) * presence."""
    out = scores.clone()
    for row in range(scores.shape[0]):
        for token in set(generated[row].tolist()):
            c = generated[row].tolist().count(token)
            out[row, token] -= c * frequency + (1 if c > 0 else 0) * presence
    return out


def test_the_penalties_are_openais_additive_formula_over_the_generated_tokens_only():
    torch.manual_seed(0)
    history = torch.randint(0, 50, (3, PROMPT + 12))  # (b, prompt + generated)
    scores = torch.randn(3, 50)
    ours = AdditivePenalties(0.7, -0.4, PROMPT)(history, scores.clone())
    assert torch.allclose(ours, _openai(scores, history[:, PROMPT:], 0.7, -0.4), atol=1e-6)
    prompt_only = history[:, :PROMPT]  # nothing generated yet: the prompt's tokens are not penalized
    assert torch.equal(AdditivePenalties(0.7, -0.4, PROMPT)(prompt_only, scores.clone()), scores)


def _options(**fields) -> dict:
    rt = SimpleNamespace(
        contract=SimpleNamespace(max_cache_len=64, device="cpu"), validator=SimpleNamespace(vocab_size=100)
    )
    return generate_options(ChatRequest(messages=[{"role": "user", "content": "hi"}], **fields), rt, PROMPT)


def test_the_servers_fields_become_hf_options():
    options = _options(logit_bias={"7": -100, "42": 3.5}, frequency_penalty=0.5, temperature=0)
    assert options["sequence_bias"] == [[[7], -100.0], [[42], 3.5]]
    (penalties,) = options["logits_processor"]
    assert (penalties.frequency, penalties.presence, penalties.prompt_len) == (0.5, 0.0, PROMPT)
    assert "logits_processor" not in _options(frequency_penalty=0, presence_penalty=0.0)  # the no-op values


def test_a_bias_outside_the_vocabulary_is_refused_by_its_field_name():
    with pytest.raises(InvalidInputError, match=r"logit_bias names token 100, outside the vocabulary 0\.\.99"):
        _options(logit_bias={"100": 1})
    with pytest.raises(InvalidInputError, match="sequence_bias holds token id 100, outside the vocabulary"):
        check_options({"sequence_bias": [[[3], 1.0], [[100], 2.0]]}, vocab_size=100)
    with pytest.raises(InvalidInputError, match=r"sequence_bias must be a non-empty list of \[token ids, bias\] pairs"):
        check_options({"sequence_bias": [[3, 1.0]]}, vocab_size=100)
