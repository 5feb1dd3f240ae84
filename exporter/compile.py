"""torch.export and AOTInductor: the only place that knows how the decode step becomes a `.so`.

Owns: example inputs, the dynamic batch dimension, the export call and the Inductor options. Options
are passed explicitly per call; nothing global is set.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.export import Dim

from runtime.cache import allocate


def example_inputs(layout, batch: int, max_cache_len: int, dtype: torch.dtype, device: str) -> tuple:
    ids = torch.zeros(batch, 1, dtype=torch.long, device=device)  # (B, 1)
    positions = torch.zeros(batch, 1, dtype=torch.long, device=device)  # (B, 1)
    cache_position = torch.tensor([1], device=device)  # (1,)
    pad_mask = torch.ones(batch, max_cache_len, dtype=torch.bool, device=device)  # (B, L)
    return (ids, positions, cache_position, pad_mask, *allocate(layout, batch, dtype, device))


def dynamic_shapes(n_kv: int, batch: int):
    """Batch is dynamic (1..B) so one `.so` serves smaller batches; with B == 1 it stays static,
    because export specialises a dimension traced at size 1 anyway. Structure mirrors forward's
    (input_ids, position_ids, cache_position, pad_mask, *kv)."""
    if batch == 1:
        return None
    b = Dim("batch", min=1, max=batch)
    return ({0: b}, {0: b}, None, {0: b}, tuple({0: b} for _ in range(n_kv)))


_FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"


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


@torch.no_grad()
def export_decode(step, layout, batch: int, max_cache_len: int, dtype: torch.dtype, device: str):
    # An example batch of 1 would specialise the batch dim, so trace at the bundle's batch (>= 2 when dynamic).
    inputs = example_inputs(layout, batch, max_cache_len, dtype, device)
    shapes = dynamic_shapes(len(inputs) - 4, batch)
    with grouped_query_sdpa():
        return torch.export.export(step, inputs, dynamic_shapes=shapes, strict=False)


def inductor_options(device: str, cpu_isa: str) -> dict:
    options = {
        "aot_inductor.package_constants_in_so": False,  # weights live once, in the bundle's safetensors
        "cpp.dynamic_threads": True,  # torch.set_num_threads governs the .so at run time
    }
    if device == "cpu" and cpu_isa == "avx2":
        options |= {"cpp.simdlen": 256, "cpp.march": "x86-64-v3"}  # portable to any AVX2 x86-64 CPU
    return options


def compile_decode(exported, package: Path, device: str, cpu_isa: str) -> Path:
    path = torch._inductor.aoti_compile_and_package(
        exported, package_path=str(package), inductor_configs=inductor_options(device, cpu_isa)
    )
    return Path(path)
