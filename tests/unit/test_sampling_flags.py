"""The command line's sampling flags (`run`, `chat`) as generate() options, and what `chat` decodes with
when they leave it open: the bundle's sampling defaults, else llama.cpp's."""

from __future__ import annotations

import pytest
from transformers import GenerationConfig

from runtime.cli.chat import turn_sampling
from runtime.cli.run import CHAT_DEFAULTS, sampling_options
from runtime.errors import InvalidInputError

GREEDY_BUNDLE = GenerationConfig(do_sample=False)  # SmolLM2-Instruct's: no sampling defaults
SAMPLING_BUNDLE = GenerationConfig(do_sample=True, temperature=0.6, top_k=20, top_p=0.9)


def test_no_flag_leaves_decoding_to_the_defaults():
    assert sampling_options() == {}
    assert sampling_options(repetition_penalty=1.1) == {"repetition_penalty": 1.1}


def test_a_sampling_flag_samples_and_greedy_stays_greedy_with_a_penalty():
    assert sampling_options(min_p=0.1) == {"min_p": 0.1, "do_sample": True}
    assert sampling_options(greedy=True, repetition_penalty=1.3) == {"do_sample": False, "repetition_penalty": 1.3}
    with pytest.raises(InvalidInputError, match="--greedy cannot be combined with --min-p"):
        sampling_options(greedy=True, min_p=0.1)
    with pytest.raises(InvalidInputError, match="repetition_penalty must be a finite number > 0, got 0"):
        sampling_options(repetition_penalty=0)
    with pytest.raises(InvalidInputError, match=r"min_p must be a number in \[0, 1\], got 2"):
        sampling_options(min_p=2)


def test_chat_samples_with_llama_cpps_defaults_when_neither_the_flags_nor_the_bundle_say():
    options, line = turn_sampling({}, GREEDY_BUNDLE)
    assert (
        options == CHAT_DEFAULTS == {"do_sample": True, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
    )
    assert "temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, llama.cpp's defaults" in line
    options, line = turn_sampling({"repetition_penalty": 1.1}, GREEDY_BUNDLE)  # a penalty alone decides nothing
    assert options == CHAT_DEFAULTS | {"repetition_penalty": 1.1} and "repetition-penalty 1.1" in line


def test_chat_keeps_the_bundles_own_sampling_defaults_and_the_command_lines_choice():
    options, line = turn_sampling({}, SAMPLING_BUNDLE)
    assert options == {} and "the bundle's defaults (temperature 0.6, top-k 20, top-p 0.9" in line
    options, line = turn_sampling({"do_sample": False}, SAMPLING_BUNDLE)
    assert options == {"do_sample": False} and line == "decoding: greedy (from the command line)"
    options, line = turn_sampling(sampling_options(temperature=1.2), GREEDY_BUNDLE)
    assert options == {"temperature": 1.2, "do_sample": True} and "temperature 1.2 (from the command line)" in line
