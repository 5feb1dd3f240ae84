"""One OpenAI request's fields as engine options: sampling, stop strings, penalties, biases, formats, n.

Owns: mapping OpenAI's request fields onto `rt.submit` keyword arguments and the server's own bounds on
stop strings; the reply's text is runtime.serve.choices'.
"""

from __future__ import annotations

import torch
from transformers.generation import LogitsProcessorList

from runtime.errors import InvalidInputError
from runtime.generation.penalties import AdditivePenalties
from runtime.serve import tools


def check_stops(stops: list[str] | None, max_stops: int, max_chars: int) -> None:
    """The server's bounds on stop strings (--max-stops, --max-stop-chars): each is matched against the
    reply's text at every token (a 1-million-character one took 16 s and 2.7 GB)."""
    if stops and len(stops) > max_stops:
        raise InvalidInputError(f"{len(stops)} stop strings; this server takes at most {max_stops}")
    if stops and max(map(len, stops)) > max_chars:
        raise InvalidInputError(f"each stop string is at most {max_chars} characters")


def generate_options(request, rt, prompt_tokens: int) -> dict:
    """OpenAI fields -> `rt.submit` keyword arguments. temperature 0 is greedy; no sampling field at all
    keeps the bundle's generation defaults; no max_tokens means up to the end of the cache."""
    options: dict = {"max_new_tokens": request.token_budget or max(1, rt.contract.max_cache_len - prompt_tokens)}
    if request.temperature == 0:
        options["do_sample"] = False
    elif any(getattr(request, f) is not None for f in ("temperature", "top_p", "top_k", "min_p")):
        options |= {"do_sample": True, "temperature": request.temperature or 1.0, "top_p": request.top_p or 1.0}
    options |= _vllm_extensions(request)
    options |= _biases(request, rt.validator.vocab_size)
    processors = LogitsProcessorList()
    if request.frequency_penalty or request.presence_penalty:
        processors.append(
            AdditivePenalties(request.frequency_penalty or 0, request.presence_penalty or 0, prompt_tokens)
        )
    if (grammar := _format(request, rt)) is not None:  # last: the mask has the final word on what comes next
        processors.append(rt.constrain(*grammar))
    if processors:
        options["logits_processor"] = processors
    if request.stop:
        options["stop_strings"] = list(request.stop)
    if request.seed is not None:
        options["generator"] = torch.Generator(rt.contract.device).manual_seed(request.seed)
    if request.prompt_lookup_num_tokens is not None:
        options["prompt_lookup_num_tokens"] = request.prompt_lookup_num_tokens
    return options


def _vllm_extensions(request) -> dict:
    """vLLM's top_k, min_p, repetition_penalty and min_tokens under HF generate's names (top_k -1: off)."""
    options = {}
    if request.top_k is not None:
        options["top_k"] = max(request.top_k, 0)
    if request.min_p is not None:
        options["min_p"] = request.min_p
    if request.repetition_penalty is not None:
        options["repetition_penalty"] = request.repetition_penalty
    if request.min_tokens:
        options["min_new_tokens"] = request.min_tokens
    return options


def _format(request, rt) -> tuple[str, object] | None:
    """The format the reply is held to: the request's, or a tool call where tool_choice demands one."""
    mode = getattr(request, "tool_mode", None)  # chat requests only
    if mode is not None:
        tools.response_template(rt)  # a bundle that cannot take tools says so before any work
    if mode in (None, "auto"):
        return request.output_format
    if request.output_format is not None:
        raise InvalidInputError(
            f"tool_choice {mode!r} holds the reply to a tool call: send it without an output format"
        )
    return "lark", tools.call_grammar(rt, request.tool_dicts, None if mode == "required" else mode)


def _biases(request, vocab_size: int) -> dict:
    """logit_bias ({"token id": bias}) as HF's sequence_bias, each id inside the vocabulary."""
    if not request.logit_bias:
        return {}
    outside = [key for key in request.logit_bias if int(key) >= vocab_size]
    if outside:
        raise InvalidInputError(f"logit_bias names token {outside[0]}, outside the vocabulary 0..{vocab_size - 1}")
    return {"sequence_bias": [[[int(key)], bias] for key, bias in request.logit_bias.items()]}


def n_choices(request, rt, options: dict) -> tuple[dict, int]:
    """`n` choices: sampled ones are rows of their own (num_return_sequences: the prompt is prefilled
    once and its rows copied, runtime.engine.runner); greedy ones would be identical, so one row is
    decoded and reported n times. Returns the options and how many choices each row makes."""
    if request.n == 1:
        return options, 1
    if not options.get("do_sample", rt.generation_config.do_sample):
        return options, request.n
    rows = rt.contract.batch_size
    if request.n > rows:
        raise InvalidInputError(
            f"n={request.n} sampled choices decode in {request.n} cache rows at once; this bundle has {rows}: "
            f"send n <= {rows}, or re-export with a larger --batch-size"
        )
    return options | {"num_return_sequences": request.n}, 1
