"""The exporter's tokenizer-class switch (exporter.tokenizer): made only where the generic fast class
behaves as the checkpoint's own, and then loaded by AutoTokenizer with the same results."""

from __future__ import annotations

import json

from transformers import AutoTokenizer

from exporter.presets import build_tokenizer
from exporter.tokenizer import SAMPLE, same_behaviour, use_generic_class


def _saved(tmp_path, tokenizer_class: str | None, family: str = "llama", **settings):
    tokenizer = build_tokenizer(family, 384)
    tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text()) | settings
    if tokenizer_class:
        config["tokenizer_class"] = tokenizer_class
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return config


def test_a_model_specific_class_that_behaves_the_same_is_switched(tmp_path):
    """A byte-level BPE saved as GPT2Tokenizer (as SmolLM-style checkpoints are), with the unk token
    GPT2Tokenizer would otherwise add written down."""
    _saved(tmp_path, "GPT2Tokenizer", family="chatml", unk_token="<|endoftext|>")
    before = AutoTokenizer.from_pretrained(tmp_path)
    assert type(before).__name__ == "GPT2Tokenizer"
    assert use_generic_class(tmp_path)
    after = AutoTokenizer.from_pretrained(tmp_path)
    assert type(after).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend")
    assert after.padding_side == before.padding_side == "left"
    for text in SAMPLE:
        assert after(text).input_ids == before(text).input_ids
    messages = [{"role": "user", "content": "Why?"}]
    assert after.apply_chat_template(messages, tokenize=False) == before.apply_chat_template(messages, tokenize=False)


def test_a_class_that_adds_a_token_of_its_own_is_not_switched(tmp_path):
    """GPT2Tokenizer adds an unk token this vocabulary lacks: the generic class would not."""
    config = _saved(tmp_path, "GPT2Tokenizer")
    assert not use_generic_class(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text()) == config


def test_a_generic_class_is_left_alone(tmp_path):
    config = _saved(tmp_path, None)
    assert not use_generic_class(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text()) == config


def test_a_class_that_cannot_load_these_files_keeps_the_checkpoints_choice(tmp_path):
    config = _saved(tmp_path, "GemmaTokenizer")  # needs an <unk> this byte-level vocabulary lacks
    assert not use_generic_class(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text()) == config


def test_differences_are_seen():
    llama, chatml = build_tokenizer("llama", 384), build_tokenizer("chatml", 384)
    assert same_behaviour(llama, build_tokenizer("llama", 384))
    assert not same_behaviour(llama, chatml)
    right = build_tokenizer("llama", 384)
    right.padding_side = "right"
    assert not same_behaviour(llama, right)
