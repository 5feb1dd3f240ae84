"""Every private torch and transformers internal the runtime relies on, each behind one named function.

Owns: the runtime's contact surface with unstable APIs. Each entry says why aotpack needs it and the
version it was checked on (torch 2.13.0, transformers 5.24.0, both pinned in pyproject.toml).
`tests/unit/test_compat.py` checks every symbol and the signature aotpack calls it with, so an upgrade
fails there first, in a second, naming the symbol, rather than deep inside a bundle test; and
`tests/unit/test_layers.py` checks that no module outside the two compat modules touches one.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager

import torch
from transformers import GenerationConfig
from transformers.generation import LogitsProcessorList, StoppingCriteriaList
from transformers.initialization import no_init_weights

_MIXIN = "transformers.generation.utils.GenerationMixin"

# (owner, attribute, what aotpack's use of it relies on) for every private symbol used below, which
# tests/unit/test_compat.py checks: a tuple names the parameters a Python callable must take; a string
# must appear in a C++ function's signature; "property" a settable property; None: it must exist.
PRIVATE_SYMBOLS = (
    (
        torch._C._aoti,
        "AOTIModelPackageLoader",
        "AOTIModelPackageLoader, arg0: str, arg1: str, arg2: bool, arg3: typing.SupportsInt",
    ),
    (
        "torch._C._aoti.AOTIModelPackageLoader",
        "load_constants",
        "use_inactive: bool, check_full_update: bool, user_managed: bool = False, allow_h2d_copy: bool = False",
    ),
    (
        _MIXIN,
        "_get_logits_processor",
        (
            "generation_config",
            "input_ids_seq_length",
            "device",
            "model_kwargs",
            "logits_processor",
            "prefix_allowed_tokens_fn",
        ),
    ),  # fmt: skip
    (_MIXIN, "_get_stopping_criteria", ("generation_config", "stopping_criteria", "tokenizer")),
    (_MIXIN, "_prepare_generation_config", ("generation_config", "kwargs")),
    (_MIXIN, "_expand_inputs_for_generation", ("expand_size", "input_ids", "model_kwargs")),
    (_MIXIN, "_prepare_special_tokens", ("generation_config", "kwargs_has_attention_mask", "device")),
    (_MIXIN, "_prepare_attention_mask_for_generation", ("inputs_tensor", "generation_config", "model_kwargs")),
    ("transformers.modeling_utils.PreTrainedModel", "_from_config", ("config", "kwargs")),
    ("transformers.configuration_utils.PreTrainedConfig", "_attn_implementation", "property"),
    # transformers serve's own table of tool-call formats by model type (for tokenizers without a
    # response_template): public in effect, but in its CLI's package
    ("transformers.cli.serving.utils", "get_response_template", ("processor", "model")),
    # the streaming reader behind tokenizer.parse_response, its events read as they come: exported by
    # transformers.utils.chat_parsing, not by transformers itself
    ("transformers.utils.chat_parsing", "ResponseParser", ("response_template", "prefix", "tools")),
    ("transformers.utils.chat_parsing.ResponseParser", "_close_current", ("events",)),
    ("transformers.utils.chat_parsing.ResponseParser", "_reset_to_implicit", ()),
)
# What `_prepare_special_tokens` sets on a GenerationConfig and special_tokens() reads (checked by running it).
SET_BY_TRANSFORMERS = ("_eos_token_tensor", "_pad_token_tensor")


def attention_implementation(config) -> str | None:
    """The attention a model runs ("sdpa", "eager", ...): transformers keeps it in a private config field."""
    return config._attn_implementation


def empty_model(cls, config, dtype: torch.dtype, attn_implementation: str):
    """A model built from its config with weight initialisation skipped (`no_init_weights`, public in
    transformers.initialization), via `_from_config`, which applies the dtype and attention settings as
    `from_pretrained` does. The parameters it allocates are never touched before the bundle's tensors
    replace them, so their pages never become resident."""
    with no_init_weights():
        return cls._from_config(config, dtype=dtype, attn_implementation=attn_implementation)


@contextmanager
def float_environment_kept():
    """Undo what loading a compiled `.so` does to this thread's floating-point state.

    Quantized bundles compile with `-funsafe-math-optimizations`, and GCC before 13 then links
    crtfastmath.o into the shared library, whose constructor sets FTZ/DAZ (subnormals flushed to
    zero) in the loading thread at dlopen, and every thread it starts later inherits it: the whole
    process's arithmetic changed silently (seen as hypothesis refusing to generate floats). The
    kernels themselves are unaffected; only the caller's state is restored here."""
    before = _flushes_subnormals()
    try:
        yield
    finally:
        if _flushes_subnormals() != before:
            torch.set_flush_denormal(before)


def _flushes_subnormals() -> bool:
    return torch.tensor([1e-40], dtype=torch.float32).mul(1.0).item() == 0.0  # 1e-40 is subnormal in fp32


def load_aoti_package(path: str, model_name: str):
    """The C++ AOTInductor package loader, for one model of the package. `torch._inductor.package.load_package`
    wraps the same object but first imports torch._inductor and torch._dynamo, about 3 s of start-up that
    loading never needs. Positional arguments (checked on torch 2.13): model name, run single-threaded,
    thread count, device index."""
    with float_environment_kept():
        return torch._C._aoti.AOTIModelPackageLoader(path, model_name, False, 1, -1)


def lend_constants(loader, tensors: dict[str, torch.Tensor]) -> None:
    """Hand the compiled model our tensors without a copy. Positional flags (torch 2.13): use_inactive=False,
    check_full_update=True, user_managed=True (the .so keeps our handles: one copy of every weight),
    allow_h2d_copy=False."""
    loader.load_constants(tensors, False, True, True, False)


def special_tokens(model, config: GenerationConfig, device) -> tuple[tuple[int, ...], int]:
    """(eos ids, pad id) exactly as `generate` resolves them (pad falls back to the first eos). The
    logits processors read the same private tensors, so they must be prepared through HF's own helper."""
    model._prepare_special_tokens(config, kwargs_has_attention_mask=True, device=device)
    eos = config._eos_token_tensor
    pad = config._pad_token_tensor
    return (tuple(eos.tolist()) if eos is not None else ()), (int(pad) if pad is not None else 0)


def inferred_attention_mask(model, config: GenerationConfig, input_ids: torch.Tensor) -> torch.Tensor:
    """The mask `generate` makes when it is given none: tokens equal to the pad id are padding, where
    the pad id is set and is no eos id; else all ones. (B, S) int64."""
    model._prepare_special_tokens(config, kwargs_has_attention_mask=True, device=input_ids.device)
    return model._prepare_attention_mask_for_generation(input_ids, config, {})


def generation_config(model, base: GenerationConfig | None, overrides: dict) -> GenerationConfig:
    """The call's generation config exactly as `generate` resolves it: `base` (a `generation_config=`
    argument) or a blank one, its unset fields filled from the model's generation config, then from
    transformers' global defaults (top_k=50 ...), then the call's keyword overrides on top."""
    config, model_kwargs = model._prepare_generation_config(base, **overrides)
    if unknown := sorted(k for k in model_kwargs if k not in ("output_attentions", "output_hidden_states")):
        raise ValueError(f"not generation options: {unknown}")
    return config


def logits_processors(
    model, config: GenerationConfig, attention_mask, custom=None, prefix_allowed_tokens_fn=None
) -> LogitsProcessorList:
    """transformers' processor list for `config`, exactly as `generate` builds it (a `logits_processor=`
    list merged in as HF merges it): the single source of truth for what each generation option means;
    re-implementing it would drift from HF. The mask matters: the repetition penalty skips left padding."""
    return model._get_logits_processor(
        generation_config=config, input_ids_seq_length=attention_mask.shape[1], device=attention_mask.device,
        model_kwargs={"attention_mask": attention_mask},
        logits_processor=custom if custom is not None else LogitsProcessorList(),
        prefix_allowed_tokens_fn=prefix_allowed_tokens_fn,
    )  # fmt: skip


def stopping_criteria(model, config: GenerationConfig, custom, tokenizer) -> StoppingCriteriaList:
    """transformers' stopping criteria for `config` as `generate` builds them: max length, max_time,
    stop strings (with `tokenizer`), eos, and a `stopping_criteria=` list merged in."""
    custom = custom if custom is not None else StoppingCriteriaList()
    return model._get_stopping_criteria(generation_config=config, stopping_criteria=custom, tokenizer=tokenizer)


def expand_inputs(model, times: int, input_ids, **model_inputs):
    """`num_return_sequences`: each row repeated `times` times in place, with its mask and images, as
    `generate` expands them."""
    return model._expand_inputs_for_generation(expand_size=times, input_ids=input_ids, **model_inputs)


class _NotAModelClass:
    """Drops the one record transformers' Pipeline.check_model_type logs for a runtime: it checks the
    model's class name against every model class of the task and logs all ~200 names, then runs it."""

    def __init__(self, class_name: str):
        self.start = f"The model '{class_name}' is not supported for"

    def filter(self, record) -> bool:
        return not record.getMessage().startswith(self.start)


def quiet_pipeline_class_check(class_name: str) -> None:
    """Install that filter once on the pipelines' logger (transformers 5.24's `transformers.pipelines.base`)."""
    import logging

    logger = logging.getLogger("transformers.pipelines.base")
    if not any(isinstance(f, _NotAModelClass) and class_name in f.start for f in logger.filters):
        logger.addFilter(_NotAModelClass(class_name))


def response_template(tokenizer, model) -> dict | None:
    """How the model writes its reply (content, reasoning, tool calls) for tokenizer.parse_response: the
    tokenizer's own `response_template`, else transformers serve's fallback for the model type."""
    from transformers.cli.serving.utils import get_response_template

    return get_response_template(tokenizer, model)


def response_parser(template: dict, prefix: str, tools: list[dict] | None):
    """transformers' streaming reader of a reply in `template`'s format after the prompt's text `prefix`:
    `feed(text)` and `finalize()` return region_open / region_chunk / region_close events.

    A region its parser cannot read (a call whose JSON the model broke off or never closed) raises in
    transformers, mid-stream, and leaves the reader stuck in that region; here it closes with `value`
    None and an `error`, and reading goes on, as a server must."""
    return _lenient_parser()(template, prefix=prefix, tools=tools)


@functools.cache
def _lenient_parser():
    from transformers.utils.chat_parsing import ResponseParser

    class LenientParser(ResponseParser):
        def _close_current(self, events: list[dict]) -> None:
            field = self._current
            try:
                super()._close_current(events)
            except ValueError as e:
                events.append({"type": "region_close", "field": field, "value": None, "error": str(e)})
                self._reset_to_implicit()

    return LenientParser
