"""Every private or unstable torch/transformers internal the exporter and benchmark rely on, each behind
one named function.

Owns: the exporter's contact surface with unstable APIs. Each entry says why aotpack needs it and the
version it was checked on (torch 2.13.0, transformers 5.24.0, both pinned in pyproject.toml).
`tests/test_compat.py` checks that every symbol still exists.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch
from transformers import CompileConfig, cache_utils, configuration_utils

from runtime.compat import float_environment_kept

# (owner, attribute) of every private or unstable symbol used below; tests/test_compat.py walks this list.
PRIVATE_SYMBOLS = (
    (cache_utils, "get_layer_types_and_kwargs"),
    (configuration_utils, "get_head_shapes"),
    ("transformers.integrations.sdpa_attention", "use_gqa_in_sdpa"),
    (CompileConfig, "_compile_all_devices"),
    (torch._inductor, "aoti_load_package"),
)
_FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"  # read by transformers.integrations.sdpa_attention at call time


def layer_types_and_kwargs(config):
    """Per decoder layer: its kind ("full_attention", "sliding_attention", ...) and that kind's cache
    arguments (the window), as transformers' own StaticCache reads them."""
    return cache_utils.get_layer_types_and_kwargs(config)


def head_shapes(config):
    """(KV heads, head dim), each an int or a per-layer list, as StaticCache allocates them."""
    return configuration_utils.get_head_shapes(config)


@contextmanager
def grouped_query_sdpa():
    """While tracing, transformers' SDPA path expands K/V to every query head (`repeat_kv`), a copy of
    the whole cache per layer per step; its GQA switch makes it call SDPA with `enable_gqa=True`
    instead, so the compiled kernel reads each KV head once. The switch is an environment variable
    read at call time, so it is set for the duration of the trace only and then restored."""
    previous = os.environ.get(_FORCE_GQA)
    os.environ[_FORCE_GQA] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[_FORCE_GQA]
        else:
            os.environ[_FORCE_GQA] = previous


def compile_on_cpu(config: CompileConfig) -> CompileConfig:
    """`generate` compiles only on GPUs unless this private flag is set: the benchmark forces it."""
    config._compile_all_devices = True
    return config


def package_metadata_and_constants(package: str) -> tuple[dict, list[str]]:
    """(metadata, constant names) of a freshly compiled package, through Inductor's Python loader (it
    imports torch._inductor, which the exporter has loaded anyway)."""
    with float_environment_kept():
        loaded = torch._inductor.aoti_load_package(package)
    return loaded.get_metadata(), loaded.get_constant_fqns()
