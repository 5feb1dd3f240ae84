"""Every private torch and transformers internal the runtime relies on, each behind one named function.

Owns: the runtime's contact surface with unstable APIs. Each entry says why aotpack needs it and the
version it was checked on (torch 2.13.0, transformers 5.24.0, both pinned in pyproject.toml).
`tests/test_compat.py` checks that every symbol still exists, so an upgrade fails there first, in a
second, naming the symbol, rather than deep inside a bundle test.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import GenerationConfig
from transformers.generation import LogitsProcessorList
from transformers.initialization import no_init_weights

# (owner, attribute) of every private symbol used below; tests/test_compat.py walks this list.
PRIVATE_SYMBOLS = (
    (torch._C._aoti, "AOTIModelPackageLoader"),
    (GenerationConfig, "_get_default_generation_params"),
    ("transformers.generation.utils.GenerationMixin", "_get_logits_processor"),
    ("transformers.generation.utils.GenerationMixin", "_prepare_special_tokens"),
    ("transformers.modeling_utils.PreTrainedModel", "_from_config"),
)


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


def load_aoti_package(path: str):
    """The C++ AOTInductor package loader. `torch._inductor.aoti_load_package` wraps the same object but
    first imports torch._inductor and torch._dynamo, about 3 s of start-up that loading never needs.
    Positional arguments (checked on torch 2.13): model name, run single-threaded, thread count, device index."""
    with float_environment_kept():
        return torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, -1)


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


def logits_processors(model, config: GenerationConfig, prompt_len: int, device) -> LogitsProcessorList:
    """transformers' processor list for `config`, exactly as `generate` builds it: the single source of
    truth for what each generation option means; re-implementing it would drift from HF."""
    return model._get_logits_processor(
        generation_config=config, input_ids_seq_length=prompt_len, device=device, model_kwargs={}
    )


def default_max_length() -> int:
    """HF generate's default total length when neither max_new_tokens nor max_length is set."""
    return GenerationConfig._get_default_generation_params()["max_length"]
