"""`aotpack export --generation KEY=VALUE`, with no bundle: what is accepted, what is refused (before
anything is loaded) and how the settings go over a checkpoint's own generation config; `inspect`'s line.
Exported and run: tests/bundle/test_cli.py::test_export_generation_defaults_are_the_bundles_and_inspect_shows_them."""

from __future__ import annotations

import pytest
from transformers import GenerationConfig

from exporter.config import ExportConfig
from exporter.generation import merged, parse
from runtime.errors import ExportError
from runtime.format.summary import _generation_lines


def test_settings_are_read_as_json_and_floats_stay_floats():
    assert parse(["do_sample=true", "temperature=1", "top_k=40", "eos_token_id=[1, 2]", "top_p = 0.9"]) == (
        ("do_sample", True), ("temperature", 1.0), ("top_k", 40), ("eos_token_id", [1, 2]), ("top_p", 0.9),
    )  # fmt: skip
    assert parse(["top_k=null"]) == (("top_k", None),)  # unsets the checkpoint's own
    assert parse(["do_sample=True", "temperature=.7", "top_p=None"]) == (
        ("do_sample", True),
        ("temperature", 0.7),
        ("top_p", None),
    )  # fmt: skip  (Python's spellings too)


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        (["temperature"], "'temperature' is not KEY=VALUE; e.g. --generation temperature=0.7"),
        (["tempreature=0.7"], "tempreature is not a generation default a bundle carries; did you mean temperature?"),
        (["output_logits=true"], "output_logits is not a generation default"),
        (["top_k=4", "top_k=5"], "top_k is given twice"),
        (["top_p=2"], r"top_p must be a number in \(0, 1\], got 2"),
        (["do_sample=yes"], "do_sample must be True or False, got 'yes'"),
        (["top_k=-1"], "top_k must be an integer >= 0"),
        (["do_sample=true", "temperature=0"], "temperature=0.0 cannot sample; give a temperature > 0"),
        (["temperature=inf"], "temperature must be a finite number"),
        (["eos_token_id=null"], "would leave the bundle no stop token"),
        (["min_new_tokens=9", "max_new_tokens=8"], "min_new_tokens=9 exceeds max_new_tokens=8"),
    ],
)
def test_bad_settings_name_the_value_and_the_fix(pairs, message):
    with pytest.raises(ExportError, match=message):
        parse(pairs)


def test_the_export_config_refuses_them_before_loading_anything(tmp_path):
    with pytest.raises(ExportError, match="did you mean top_p"):
        ExportConfig(model="no-such-model", out=tmp_path / "b", generation=(("top_q", 0.9),))
    with pytest.raises(ExportError, match="max_new_tokens=64 does not fit --max-cache-len 64"):
        ExportConfig(model="no-such-model", out=tmp_path / "b", max_cache_len=64, generation={"max_new_tokens": 64})
    config = ExportConfig(model="no-such-model", out=tmp_path / "b", generation={"top_k": 4})  # a dict will do
    assert config.generation == (("top_k", 4),)


def test_settings_go_over_the_checkpoints_own_config_without_changing_it():
    base = GenerationConfig(do_sample=True, top_k=64, top_p=0.95, eos_token_id=1)
    config = merged(base, parse(["do_sample=false"]), vocab_size=100)  # the leftover top_k/top_p are not the user's
    assert (config.do_sample, config.top_k, config.eos_token_id) == (False, 64, 1)
    assert base.do_sample is True
    assert merged(base, (), vocab_size=100) is base  # nothing asked: the checkpoint's config as it is


def test_a_setting_that_would_do_nothing_is_refused():
    with pytest.raises(ExportError, match=r"--generation temperature=0.7: .*`do_sample` is not set to `True`"):
        merged(GenerationConfig(), parse(["temperature=0.7"]), vocab_size=100)


def test_a_checkpoint_that_samples_cannot_be_given_temperature_zero():
    """OpenAI's temperature 0 means greedy; HF's sampling at 0 fails every call: refused, with the fix."""
    with pytest.raises(ExportError, match="would sample at temperature 0.0.*do_sample=false"):
        merged(GenerationConfig(do_sample=True, temperature=0.6), parse(["temperature=0"]), vocab_size=100)


def test_a_stop_token_outside_the_vocabulary_is_refused():
    with pytest.raises(ExportError, match=r"eos_token_id 100 is outside the vocabulary 0\.\.99"):
        merged(None, parse(["eos_token_id=[3, 100]"]), vocab_size=100)


def test_inspect_shows_the_defaults_or_says_there_are_none():
    config = {"do_sample": True, "temperature": 0.7, "top_k": None, "transformers_version": "5", "output_scores": 0}
    assert _generation_lines(config) == [
        "generation   do_sample true, temperature 0.7 (generation_config.json; the caller's options override them)"
    ]
    assert _generation_lines({"bos_token_id": 1}) == ["generation   no defaults: greedy unless the caller samples"]
    assert _generation_lines(None) == []
