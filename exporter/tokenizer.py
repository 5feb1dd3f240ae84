"""The bundle's tokenizer class: transformers' generic fast tokenizer where it provably behaves the same.

Why: transformers 5 loads a model-specific tokenizer class (GemmaTokenizer, GPT2Tokenizer, ...) by
parsing `tokenizer.json` in Python and rebuilding the tokenizer, on top of the Rust parse that the
generic `PreTrainedTokenizerFast` does alone: 3.4 s against 3.1 s for Gemma 3's 262k vocabulary, 1.4
against 0.3 s for SmolLM2, most of a bundle's start-up. Both read the same files. The bundle switches
to the generic class only when it encodes, pads, decodes and renders the chat template of a fixed
sample exactly as the checkpoint's own class does; the padding side that class implies is written
down, since the generic class would otherwise pad on the right.
"""

from __future__ import annotations

import json
from pathlib import Path

GENERIC = ("PreTrainedTokenizerFast", "TokenizersBackend")
SAMPLE = (
    "Why is the sky blue?",
    "  leading spaces,\ttabs\n\nand blank lines  \r\n",
    "Numbers 0 12 345 6789 3.14159, code: def f(x): return x**2  # ok",
    "Unicode: café naïve 日本語 テキスト Ünïcödé 🙂👍🏽 \u00a0nbsp",
    "a" * 200,
)
CONVERSATION = (
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Why is the sky blue?"},
    {"role": "assistant", "content": " Rayleigh scattering. "},
    {"role": "user", "content": "And the sea?"},
)


def use_generic_class(folder: Path) -> bool:
    """Switch the saved tokenizer in `folder` to the generic class if it behaves identically; returns
    whether it did."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = folder / "tokenizer_config.json"
    if not path.is_file() or not (folder / "tokenizer.json").is_file():
        return False
    config = json.loads(path.read_text())
    if config.get("tokenizer_class") in GENERIC:
        return False
    try:
        original = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        generic = PreTrainedTokenizerFast.from_pretrained(
            folder, local_files_only=True, padding_side=original.padding_side
        )
        same = same_behaviour(original, generic)
    except Exception:  # noqa: BLE001 (a class that cannot be compared keeps the checkpoint's choice)
        return False
    if same:
        config |= {"tokenizer_class": "PreTrainedTokenizerFast", "padding_side": original.padding_side}
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False))
    return same


def same_behaviour(a, b) -> bool:
    """Same ids, masks, padding, decoded text, special tokens and chat template on the sample."""
    texts = [*SAMPLE, " ".join(a.all_special_tokens)]
    settings = ("padding_side", "truncation_side", "model_input_names", "special_tokens_map", "all_special_ids")
    if any(getattr(a, name) != getattr(b, name) for name in settings) or len(a) != len(b):
        return False
    for text in texts:
        ids = a(text)["input_ids"]
        if dict(a(text)) != dict(b(text)):
            return False
        if any(a.decode(ids, skip_special_tokens=s) != b.decode(ids, skip_special_tokens=s) for s in (False, True)):
            return False
    if a.pad_token is not None and a(texts[:3], padding=True).data != b(texts[:3], padding=True).data:
        return False
    return _same_template(a, b)


def _same_template(a, b) -> bool:
    """The same text from the chat template, tokenized the same (with and without a system turn, as
    some templates refuse one)."""
    if (a.chat_template is None) != (b.chat_template is None):
        return False
    if a.chat_template is None:
        return True
    for conversation in (list(CONVERSATION), list(CONVERSATION[1:])):
        try:
            text = a.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        except Exception:  # noqa: BLE001 (e.g. "System role not supported")
            continue
        if text != b.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True):
            return False
        if a(text, add_special_tokens=False)["input_ids"] != b(text, add_special_tokens=False)["input_ids"]:
            return False
        return True
    return False
