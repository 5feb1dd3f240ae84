"""The memory-bandwidth floor of one decode step, and the ceiling torch's own GEMV sets under it.

Owns: measuring this machine's memory read bandwidth on the spot, counting the bytes a decode step
must read (every weight it uses: the embedding table counts as one row, unless it is also the
`lm_head`, which reads all of it; plus the KV cache as allocated, which attention reads whole), and
measuring how fast torch's batch-1 `linear` reads a weight of the model's largest shape. A batch-1
decode step is a chain of such GEMVs, so that rate, not the bandwidth, is what any torch-kernel
decode (eager, torch.compile or AOTInductor, which all call it) can reach.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from safetensors import safe_open

from runtime.manifest import Manifest


def read_bandwidth(threads: int, mib: int = 512, repeats: int = 7) -> float:
    """Best-of-N bytes/s of a full read (a sum) over a buffer much larger than the caches."""
    torch.set_num_threads(threads)
    buffer = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    buffer.sum()  # page in
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * 4 / best


def gemv_bandwidth(rows: int, cols: int, dtype: torch.dtype, threads: int, repeats: int = 7) -> float:
    """Best-of-N bytes/s of torch's `linear` at batch 1 over a (rows, cols) weight of `dtype`."""
    torch.set_num_threads(threads)
    weight = torch.full((rows, cols), 0.01, dtype=dtype)  # (rows, cols), e.g. (vocab, hidden)
    x = torch.full((1, cols), 0.01, dtype=dtype)  # (1, cols): one token
    best = float("inf")
    with torch.inference_mode():
        torch.nn.functional.linear(x, weight)  # page in, pick the kernel
        for _ in range(repeats):
            start = time.perf_counter()
            torch.nn.functional.linear(x, weight)
            best = min(best, time.perf_counter() - start)
    return weight.numel() * weight.element_size() / best


def bytes_per_step(bundle: Path, manifest: Manifest) -> dict:
    """Weight bytes and KV bytes one decode step (batch 1) reads."""
    handles = {p.name: safe_open(str(p), "pt") for p in Path(bundle).glob("*.safetensors")}
    shapes = {key: h.get_slice(key) for h in handles.values() for key in h.keys()}
    itemsize = torch.empty((), dtype=getattr(torch, manifest.dtype)).element_size()
    by_path: dict[str, str] = {}  # eager tensor -> one constant name using it
    weights, largest = 0, (0, 0)
    for const in manifest.constants:
        if const.safetensors_key is None or const.module_path in by_path:
            continue
        by_path[const.module_path] = const.name
        shape = shapes[const.safetensors_key].get_shape()
        numel = 1
        for n in shape:
            numel *= n
        is_table = const.module_path.endswith("embed_tokens.weight")
        tied = is_table and any(c.name.endswith("lm_head.weight") and c.module_path == const.module_path for c in manifest.constants)
        weights += (shape[-1] if is_table and not tied else numel) * itemsize
        if len(shape) == 2 and (tied or not is_table) and numel > largest[0] * largest[1]:
            largest = tuple(shape)
    kv = sum(manifest.cache_bytes) // manifest.batch_size
    return {"weight_bytes": weights, "kv_bytes": kv, "total_bytes": weights + kv, "largest_weight": list(largest)}
