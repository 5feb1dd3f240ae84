"""Every private or unstable torch/transformers internal the exporter and benchmark rely on, each behind
one named function.

Owns: the exporter's contact surface with unstable APIs. Each entry says why aotpack needs it and the
version it was checked on (torch 2.13.0, transformers 5.24.0, both pinned in pyproject.toml).
`tests/unit/test_compat.py` checks every symbol and the signature aotpack calls it with.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch
from transformers import CompileConfig, cache_utils, configuration_utils

from runtime.compat import float_environment_kept

# (owner, attribute, what aotpack's use relies on) of every private or unstable symbol used below, as in
# runtime.compat.PRIVATE_SYMBOLS; tests/unit/test_compat.py checks them.
PRIVATE_SYMBOLS = (
    (cache_utils, "get_layer_types_and_kwargs", ("config",)),
    (configuration_utils, "get_head_shapes", ("config",)),
    ("transformers.integrations.sdpa_attention", "use_gqa_in_sdpa", ("attention_mask", "key", "value")),
    (CompileConfig, "_compile_all_devices", None),
    (torch._inductor, "aot_compile", ("gm", "args", "kwargs", "options")),
    ("torch._inductor.package", "package_aoti", ("archive_file", "aoti_files")),
    ("torch._inductor.package", "load_package", ("path", "model_name")),
    ("torch._inductor.cpp_builder", "get_cpp_compiler", ()),
    (
        torch.ops.aten,
        "_scaled_dot_product_flash_attention_for_cpu",
        "Tensor query, Tensor key, Tensor value, float dropout_p=0., bool is_causal=False, *, Tensor? attn_mask=None, "
        "float? scale=None",
    ),
    ("transformers.configuration_utils.PreTrainedConfig", "_attn_implementation", "property"),
    ("torch._inductor.codegen.cpp.CppKernel", "decide_parallel_depth", ("max_parallel_depth", "threads")),
    ("torch._inductor.codegen.cpp", "ParallelDepth", ("parallel_depth", "start_depth")),
    ("torch._guards", "detect_fake_mode", ("inputs",)),
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


def aoti_compile(exported, options: dict) -> list:
    """Compile an exported program with AOTInductor into the files of one packaged model, as
    `aoti_compile_and_package` does before packaging (its docstring's recipe for several models)."""
    args, kwargs = exported.example_inputs
    module = exported.module(check_guards=False)
    with serial_small_loops():
        return torch._inductor.aot_compile(module, args, kwargs, options=options | {"aot_inductor.package": True})


# Elements of a CPU loop nest of static size that runs on one thread (serial_small_loops); in each graph's
# metadata too (exporter.compile), as provenance. (No cache can hand back code generated otherwise: an AOT
# compile skips Inductor's FX graph cache, and its kernels are named by their code.)
SERIAL_UP_TO = 4096


@contextmanager
def serial_small_loops():
    """While compiling: a CPU loop nest of static size up to SERIAL_UP_TO elements is generated serial.
    With `cpp.dynamic_threads` (the thread count is the runtime's), Inductor gives every loop nest an
    OpenMP parallel region whatever its size (`CppKernel.decide_parallel_depth`): a one-row step's norms
    and rotary embeddings (640 to 2,048 elements) each paid a fork and a barrier (Gemma 3's batch-1
    graph: 25 regions in its code, 225 a step; 3 and 15 left). A nest whose size depends on the span or
    a dynamic batch keeps its region. A serial reduction's sum no longer depends on the thread count."""
    from torch._inductor.codegen import cpp

    original = cpp.CppKernel.decide_parallel_depth

    def decide(self, max_parallel_depth, threads):
        chosen = original(self, max_parallel_depth, threads)
        # `threads` is the compiling process's: at 1, a serial nest inside a region another nest of its
        # kernel opened gets no `omp single` and would run on every thread of the run time's team
        serial = threads > 1 and is_small(self.call_ranges or ())
        return cpp.ParallelDepth(0, chosen.start_depth) if serial else chosen

    cpp.CppKernel.decide_parallel_depth = decide
    try:
        yield
    finally:
        cpp.CppKernel.decide_parallel_depth = original


def is_small(extents) -> bool:
    """Whether a loop nest of these extents (ints or sympy expressions) has a static size of at most
    SERIAL_UP_TO elements."""
    size = 1
    for extent in extents:
        size = size * extent
    return bool(getattr(size, "is_number", True)) and int(size) <= SERIAL_UP_TO


def cpp_compiler() -> str:
    """The C++ compiler Inductor compiles the decode graphs with (CXX, else its default): aotpack's own
    kernels are built with the same one."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    return get_cpp_compiler()


def aoti_package(package: str, models: dict[str, list]) -> str:
    """Several compiled models in one `.pt2`, each under its name."""
    from torch._inductor.package import package_aoti

    return package_aoti(package, models)


def package_metadata_and_constants(package: str, model_name: str) -> tuple[dict, list[str]]:
    """(metadata, constant names) of one model of a freshly compiled package, through Inductor's Python
    loader (it imports torch._inductor, which the exporter has loaded anyway)."""
    from torch._inductor.package import load_package

    with float_environment_kept():
        loaded = load_package(package, model_name)
    return loaded.get_metadata(), loaded.get_constant_fqns()


def fake_mode(values):
    """The fake mode an exported graph's `meta["val"]` tensors live in: a rewrite of the graph
    (exporter.siblings) computes its new nodes' values in it."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode(values)


def cpu_flash_attention(query, key, value, mask, scale):
    """ATen's CPU flash attention kernel, called directly: query (B, heads, q, D), grouped key and value
    heads as they are (no copy), an additive mask; returns (B, heads, q, D)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, False, attn_mask=mask, scale=scale
    )[0]


@contextmanager
def attention_installed(model, name: str, function):
    """`model` runs its attention through `function` (transformers' attention signature) while the block
    runs: registered with transformers' AttentionInterface (and its mask interface, as SDPA's), then
    switched on in the config's private attention field and restored."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, sdpa_mask)
    previous = model.config._attn_implementation
    model.config._attn_implementation = name
    try:
        yield
    finally:
        model.config._attn_implementation = previous
