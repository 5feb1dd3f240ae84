"""What each generate() option may be: checked before transformers sees it.

Owns: the type and range of every generation option a call may pass. transformers' own checks raise
ValueError or TypeError for some bad values and silently accept others (`top_p=2`, `temperature=inf`,
`do_sample="no"`, which turns sampling on); here every value either means what it means in HF
`generate` or is refused with an InvalidInputError that names it. The ranges are those of transformers'
logits processors, which then run unchanged.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import torch

from runtime.errors import InvalidInputError


def _int(v) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)


def finite_real(v) -> bool:
    """A finite int or float, not a bool (which is an int to Python)."""
    return isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v)


def _ids(v) -> bool:
    return isinstance(v, (list, tuple)) and all(_int(t) for t in v)


def _bias(pair) -> bool:
    pair_of = isinstance(pair, (list, tuple)) and len(pair) == 2
    return pair_of and _ids(pair[0]) and len(pair[0]) > 0 and finite_real(pair[1])


# name -> (accepts the value, what it must be)
RULES = {
    "max_new_tokens": (lambda v: _int(v) and v >= 1, "a positive integer"),
    "max_length": (lambda v: _int(v) and v >= 1, "a positive integer"),
    "min_new_tokens": (lambda v: _int(v) and v >= 0, "an integer >= 0"),
    "do_sample": (lambda v: isinstance(v, bool), "True or False"),
    # HF ignores it when greedy; with do_sample=True, <= 0 is refused (runtime.generation.validate), as HF's warper is
    "temperature": (finite_real, "a finite number"),
    "top_k": (lambda v: _int(v) and v >= 0, "an integer >= 0 (0 turns it off)"),
    "top_p": (lambda v: finite_real(v) and 0 < v <= 1, "a number in (0, 1]"),
    "min_p": (lambda v: finite_real(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "typical_p": (lambda v: finite_real(v) and 0 < v <= 1, "a number in (0, 1]"),
    "repetition_penalty": (lambda v: finite_real(v) and v > 0, "a finite number > 0"),
    "no_repeat_ngram_size": (lambda v: _int(v) and v >= 0, "an integer >= 0"),
    "eos_token_id": (lambda v: _int(v) or (_ids(v) and len(v) > 0), "a token id or a non-empty list of them"),
    "pad_token_id": (_int, "a token id"),
    "bad_words_ids": (
        lambda v: isinstance(v, (list, tuple)) and len(v) > 0 and all(_ids(w) and len(w) > 0 for w in v),
        "a non-empty list of non-empty lists of token ids",
    ),
    "suppress_tokens": (_ids, "a list of token ids"),
    "sequence_bias": (
        lambda v: isinstance(v, (list, tuple)) and len(v) > 0 and all(_bias(p) for p in v),
        "a non-empty list of [token ids, bias] pairs",
    ),
    "begin_suppress_tokens": (_ids, "a list of token ids"),
    "bos_token_id": (_int, "a token id"),
    "max_time": (lambda v: finite_real(v) and v >= 0, "a number of seconds >= 0"),
    "epsilon_cutoff": (lambda v: finite_real(v) and 0 <= v < 1, "a number in [0, 1)"),
    "eta_cutoff": (lambda v: finite_real(v) and 0 <= v < 1, "a number in [0, 1)"),
    "num_return_sequences": (lambda v: _int(v) and v >= 1, "a positive integer"),
    "num_beams": (lambda v: _int(v) and v >= 1, "a positive integer"),
    # speculative decoding by prompt lookup (runtime.engine.speculation); 0 turns it off for the request
    "prompt_lookup_num_tokens": (lambda v: _int(v) and v >= 0, "an integer >= 0 (0: no drafts)"),
    "max_matching_ngram_size": (lambda v: _int(v) and v >= 1, "a positive integer"),
    **{
        name: (lambda v: isinstance(v, bool), "True or False")
        for name in (
            "return_dict_in_generate",
            "output_scores",
            "output_logits",
            "use_cache",
            "output_attentions",
            "output_hidden_states",
        )
    },  # fmt: skip
}


FLOATS = (
    "temperature",
    "top_p",
    "min_p",
    "typical_p",
    "repetition_penalty",
    "max_time",
    "epsilon_cutoff",
    "eta_cutoff",
)  # HF's processors want floats


def check_options(options: dict, vocab_size: int) -> dict:
    """Refuse any option value outside what HF generate gives a meaning to (token ids must be in the
    vocabulary); returns the options with integral values of float options as floats (2 -> 2.0)."""
    for name, value in options.items():
        if value is None or name not in RULES:
            continue
        accepts, meaning = RULES[name]
        if not accepts(value):
            raise InvalidInputError(f"{name} must be {meaning}, got {value!r:.60}")
    for name in ("bad_words_ids", "suppress_tokens", "begin_suppress_tokens", "sequence_bias"):
        ids = _listed_ids(name, options.get(name))
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise InvalidInputError(f"{name} holds token id {bad[0]}, outside the vocabulary 0..{vocab_size - 1}")
    return {k: float(v) if k in FLOATS and v is not None else v for k, v in options.items()}


def _listed_ids(name: str, value) -> list[int]:
    """Every token id an id-listing option names."""
    if not value:
        return []
    if name == "sequence_bias":
        return [t for ids, _ in value for t in ids]
    return [t for w in value for t in w] if name == "bad_words_ids" else list(value)


def check_generator(generator, device: str) -> None:
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise InvalidInputError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if generator.device.type != device:
        raise InvalidInputError(f"generator is on {generator.device}, the bundle samples on {device}")


def check_stop_strings(value) -> tuple[str, ...]:
    """A string or a list of non-empty strings, as HF's StopStringCriteria takes."""
    if value is None:
        return ()
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, (list, tuple)) or not strings or not all(isinstance(s, str) and s for s in strings):
        raise InvalidInputError(f"stop_strings must be a non-empty string or a list of them, got {value!r:.60}")
    return tuple(strings)
