"""The memory-bandwidth floor of one decode step, and the ceiling torch's own GEMV sets under it.

Owns: measuring this machine's memory read bandwidth on the spot (over as many bytes as a step
reads), counting the bytes a decode step must read (every weight it uses: the embedding table counts
as one row, unless it is also the `lm_head`, which reads all of it; plus the KV cache within the span
attention reads), and measuring how fast torch's batch-1 `linear` reads a weight of the
model's largest shape. A batch-1
decode step is a chain of such GEMVs, so that rate, not the bandwidth, is what any torch-kernel
decode (eager, torch.compile or AOTInductor, which all call it) can reach.
"""

from __future__ import annotations

import math

import torch

from exporter.timing import median_seconds
from runtime.format.manifest import Manifest


def read_bandwidth(nbytes: int, threads: int, repeats: int = 9) -> float:
    """Bytes/s of reading a buffer of `nbytes` over and over: the median read of the faster of two
    read kernels, `sum` and an fp32 GEMV over the same bytes (`sum` alone is compute-limited on this
    CPU, about 18 GB/s against 24 for the GEMV, and would set the floor too low).

    The buffer is as large as what one decode step reads, because a step re-reads the same weights
    every token: whatever part of them the last-level cache keeps (300 MiB of L3 here, against 0.5-1 GiB
    of weights) helps this measurement exactly as much as it helps the step. The median, like the
    decode figure it is compared with, because this shared machine has bursts: best-of-N read 24-37 GB/s
    within minutes."""
    torch.set_num_threads(threads)
    buffer = torch.ones(max(nbytes // 4 // 1024, 1) * 1024, dtype=torch.float32)  # (n,)
    matrix, vector = buffer.view(-1, 1024), torch.ones(1024)  # (n / 1024, 1024), (1024,)
    fastest = min(median_seconds(read, repeats=repeats) for read in (buffer.sum, lambda: torch.mv(matrix, vector)))
    return buffer.numel() * 4 / fastest


def gemv_bandwidth(rows: int, cols: int, dtype: torch.dtype, threads: int, repeats: int = 9) -> float:
    """Bytes/s of torch's `linear` at batch 1 over a (rows, cols) weight of `dtype` (median call)."""
    torch.set_num_threads(threads)
    weight = torch.full((rows, cols), 0.01, dtype=dtype)  # (rows, cols), e.g. (vocab, hidden)
    x = torch.full((1, cols), 0.01, dtype=dtype)  # (1, cols): one token
    with torch.inference_mode():
        seconds = median_seconds(torch.nn.functional.linear, x, weight, repeats=repeats)
    return weight.numel() * weight.element_size() / seconds


def _is_embedding(manifest: Manifest):
    """Whether a module path belongs to the token embedding table (quantized: its packed tensors)."""
    q = manifest.quantization
    if q is not None and q.embedding is not None:
        return lambda path: path.startswith(q.embedding + ".")
    return lambda path: path.endswith("embed_tokens.weight")


def bytes_per_step(manifest: Manifest, span: int) -> dict:
    """Weight bytes and KV bytes one decode step (batch 1) at a context of `span` tokens reads, from the
    manifest's constants (each records its dtype and shape); non-persistent buffers such as rotary
    `inv_freq` are not weights. The embedding table counts one row per step, unless it is also the
    lm_head, which reads all of it. Attention reads each layer's slots within the span (a ring: at most
    its window)."""
    is_embedding = _is_embedding(manifest)
    heads = {c.module_path for c in manifest.constants if "lm_head" in c.name}
    seen: set[str] = set()  # eager tensors already counted: a tied weight backs two constants
    weights, largest = 0, (0, 0)
    for const in manifest.constants:
        if const.safetensors_key is None or const.module_path in seen:
            continue
        seen.add(const.module_path)
        numel, itemsize = math.prod(const.shape), torch.empty((), dtype=getattr(torch, const.dtype)).element_size()
        row_only = is_embedding(const.module_path) and const.module_path not in heads
        weights += (numel // const.shape[0] if row_only else numel) * itemsize
        if len(const.shape) == 2 and not row_only and numel > math.prod(largest):
            largest = const.shape
    kv = sum(
        layer.nbytes(1, manifest.dtype) * min(span, layer.slots) // layer.allocated for layer in manifest.cache_layout
    )
    return {"weight_bytes": weights, "kv_bytes": kv, "total_bytes": weights + kv, "largest_weight": list(largest)}
