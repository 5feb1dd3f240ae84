"""The generation defaults a bundle carries: `aotpack export --generation KEY=VALUE`, as an Ollama
Modelfile's PARAMETER lines set them.

Owns: parsing the settings at the edge, refusing an unknown key or a bad value before anything is loaded,
and merging them over the checkpoint's own generation config, which the bundle's generation_config.json
then holds (`run`, `chat`, `serve` and `generate` take their defaults from it; `inspect` shows them).
"""

from __future__ import annotations

import copy
import difflib
import json

from runtime.errors import ExportError, InvalidInputError
from runtime.format.files import GENERATION_DEFAULTS
from runtime.generation.options import check_options

KEYS = GENERATION_DEFAULTS  # how to sample and how long to go: not output formats, beams or specials


def parse(pairs: list[str] | tuple[str, ...]) -> tuple[tuple[str, object], ...]:
    """`["temperature=0.7", "do_sample=true"]` -> (("temperature", 0.7), ("do_sample", True)), each value
    read as JSON (numbers, true/false, null, lists of ids) and checked as generate() would check it."""
    settings = []
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ExportError(f"--generation {pair!r} is not KEY=VALUE; e.g. --generation temperature=0.7")
        settings.append((key.strip(), _value(text.strip())))
    return checked(settings)


def checked(settings) -> tuple[tuple[str, object], ...]:
    """(key, value) pairs refused unless each key is one of KEYS, given once, with a value generate()
    accepts; integral values of float settings become floats."""
    seen: dict[str, object] = {}
    for key, value in settings.items() if isinstance(settings, dict) else settings:
        if key not in KEYS:
            near = difflib.get_close_matches(key, KEYS, n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            what = f"--generation {key} is not a generation default a bundle carries"
            raise ExportError(f"{what}; {hint}use one of {', '.join(KEYS)}")
        if key in seen:
            raise ExportError(f"--generation {key} is given twice; give each setting once")
        seen[key] = value
    if "eos_token_id" in seen and seen["eos_token_id"] is None:
        raise ExportError("--generation eos_token_id=null would leave the bundle no stop token; give the ids")
    low, high = seen.get("min_new_tokens"), seen.get("max_new_tokens")
    if isinstance(low, int) and isinstance(high, int) and low > high:
        raise ExportError(f"--generation min_new_tokens={low} exceeds max_new_tokens={high}; lower it")
    return tuple(_checked(seen).items())


# Python's spellings, which a user writes as often as JSON's
_PYTHON = {"True": True, "False": False, "None": None}


def _value(text: str) -> object:
    if text in _PYTHON:
        return _PYTHON[text]
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return float(text)  # .7, 1e-1, inf (which check_options refuses by name)
    except ValueError:
        return text  # kept as text, which check_options then names as the wrong type


def _checked(settings: dict) -> dict:
    """The values as generate() checks them (null unsets the checkpoint's own), integral floats as floats."""
    try:
        settings = check_options(settings, vocab_size=1 << 62)  # token ids: checked against the model's in `merged`
    except InvalidInputError as e:
        raise ExportError(f"--generation: {e}") from None
    temperature = settings.get("temperature")
    if settings.get("do_sample") is True and temperature is not None and temperature <= 0:
        raise ExportError(
            f"--generation temperature={temperature} cannot sample; give a temperature > 0, or "
            "do_sample=false to decode greedily"
        )
    return settings


def merged(base, settings: tuple[tuple[str, object], ...], vocab_size: int):
    """A copy of the checkpoint's GenerationConfig (or a fresh one) with `settings` over it, refused if a
    stop token is outside the vocabulary or transformers would warn that a setting does nothing
    (temperature without do_sample=true, say; the checkpoint's own leftovers are not the user's to fix)."""
    from transformers import GenerationConfig

    if not settings:
        return base
    config = copy.deepcopy(base) if base is not None else GenerationConfig()
    eos = dict(settings).get("eos_token_id")
    outside = [t for t in ([eos] if isinstance(eos, int) else eos or []) if not 0 <= t < vocab_size]
    if outside:
        raise ExportError(f"--generation eos_token_id {outside[0]} is outside the vocabulary 0..{vocab_size - 1}")
    config.update(**dict(settings))
    if config.do_sample and config.temperature is not None and config.temperature <= 0:
        raise ExportError(
            f"--generation: the bundle would sample at temperature {config.temperature}, which cannot sample; "
            "give a temperature > 0, or do_sample=false to decode greedily"
        )
    try:
        config.validate(strict=True, user_set_attributes={key for key, _ in settings})
    except ValueError as e:
        raise ExportError(f"--generation {_shown(settings)}: {' '.join(str(e).split())}") from None
    return config


def _shown(settings) -> str:
    return " ".join(f"{key}={json.dumps(value)}" for key, value in settings)
