"""How the compiled decode step reads its weights: a build-time choice of GEMV kernel per weight shape.

Owns: the candidate lowerings of a decode-step linear layer, timing them on the build machine, and
rewriting the exported graph so each weight shape is read by the fastest candidate.

A batch-1 decode step is a chain of GEMVs, and which kernel reads a weight fastest depends on the CPU
and the shape: on an AVX2-only AMD EPYC, torch's fp32 `linear` read Gemma 3's 262144x640 `lm_head` at
10 GB/s and an Inductor reduction over the same tensor at 30 GB/s (20-29 against 8-11 GB/s on its layer
shapes), while on an AVX-512 Xeon hand-shaped bf16 reductions gained nothing over torch's
`linear`. Since the export runs on the target (native ISA), each candidate is compiled with
the bundle's own Inductor options and timed here, and the choice and every candidate's rate go in the
manifest. Every candidate computes the same function up to summation order (fp32 accumulation, output
in the activation dtype), so the parity gate that follows covers whichever wins.

Quantized weights are read by fused dequantize-and-reduce kernels over runtime.quant's packed words:
int8 either as whole words split with shifts, or as bytes (whichever the CPU's vector loads favour);
int4 one word at a time, broadcast to 8 lanes and split with per-lane shifts. ATen's weight-only ops
need layouts of their own (a second copy) and were slower on the 262144x640 shape here anyway
(`_weight_int8pack_mm` 17.5 ms against 15.0, `_weight_int4pack_mm_for_cpu` 13.2 ms against 12.9).

All lowerings put the weight rows outermost (output (rows, batch), transposed at the end), so that a
batch larger than one re-reads each weight row from L1 rather than the whole weight from memory.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from runtime.compat import float_environment_kept
from runtime.manifest import Lowering
from runtime.quant import INT4, INT8, SCALE_DTYPE, WORD_FIELDS

LINEAR = "linear"
_ATEN = torch.ops.aten.linear.default
_INT8 = torch.ops.aotpack.woq_linear_int8.default
_INT4 = torch.ops.aotpack.woq_linear_int4.default


def _realized(t: torch.Tensor) -> torch.Tensor:
    """`t` as a buffer of its own. Without the barrier, Inductor inlines the producer (e.g. the RMSNorm's
    scaling) into the reduction, where it is recomputed for every weight row: the lm_head then read at
    19 GB/s instead of 30. `as_strided` is lowered by realizing its input."""
    return torch.as_strided(t, t.shape, t.stride())


def _flat(x: torch.Tensor) -> torch.Tensor:
    """x (..., K) as fp32 (B, K), not yet realized."""
    return x.reshape(-1, x.shape[-1]).float()


def _activations(x: torch.Tensor) -> torch.Tensor:
    """x (..., K) as a realized fp32 (B, K) buffer."""
    return _realized(_flat(x))


def _byte_planes(words: torch.Tensor) -> torch.Tensor:
    """int32 words (..., 1, c) -> their 4 bytes as sign-extended fp32 (..., 4, c), byte j in plane j."""
    shifts = (24 - 8 * torch.arange(4, dtype=torch.int32, device=words.device))[:, None]  # (4, 1): byte j to the top
    return ((words << shifts) >> 24).float()


def _rows_outer(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(rows, B) fp32 -> x's leading shape + (rows,), in x's dtype."""
    return y.t().reshape(*x.shape[:-1], y.shape[0]).to(x.dtype)


def aten_linear(x, w, b=None):
    y = torch.matmul(x, w.t())  # ATen's mm, as the graph had it (not `linear`: that would recurse here)
    return y + b if b is not None else y


def reduce_linear(x, w, b=None):
    x2 = _activations(x)  # (B, K)
    y = _rows_outer((w.float()[:, None, :] * x2[None]).sum(-1), x)  # weight (N, 1, K) * x (1, B, K)
    return y + b if b is not None else y


def int8_words(x, words, scales):
    """Each vector of 8 words is loaded (and bit-cast, which Inductor does through a stack buffer) once
    and split into its 4 byte planes, so x is permuted to match: word c's byte j multiplies
    x[j * K/4 + c]. With the planes outermost instead, every word was loaded and bit-cast 4 times
    (layer shapes read 11-16 GB/s against 14-21 here)."""
    rows, count = words.shape  # count = K / 4
    if count % 8:  # too few words for whole vectors of them: planes outermost
        return _int8_planes_outer(x, words, scales)
    # realized only once permuted: one loop, not two. planes[b, c, j, i] = x[b, j*K/4 + 8c + i]
    planes = _realized(_flat(x).view(-1, 4, count // 8, 8).transpose(1, 2).contiguous())  # (B, K/32, 4, 8)
    q = _byte_planes(words.view(torch.int32).view(rows, 1, count // 8, 1, 8))  # (N, 1, K/32, 4, 8)
    return _rows_outer((q * planes[None]).sum((-1, -2, -3)) * scales.float()[:, None], x)


def _int8_planes_outer(x, words, scales):
    rows, count = words.shape
    x2 = _activations(x).view(1, -1, 4, count)  # (1, B, 4, K/4): x[b, j * K/4 + c]
    q = _byte_planes(words.view(torch.int32)[:, None, None, :])  # (N, 1, 4, K/4)
    return _rows_outer((q * x2).sum((-1, -2)) * scales.float()[:, None], x)


def int8_bytes(x, words, scales):
    """The same bytes read as an int8 (N, K) matrix whose columns are in stored order, so x is permuted
    to match (stored column 4c + j is column j * K/4 + c). Fast where Inductor's int8 vector loads are
    (AVX-512); on AVX2 they go through a memcpy, and `int8_words` wins."""
    rows, count = words.shape
    # (B, K) in stored column order, realized once permuted (one loop, as in int8_words)
    permuted = _realized(_flat(x).view(-1, 4, count).transpose(1, 2).reshape(-1, 4 * count))
    q = words.view(torch.int8).view(rows, 4 * count).float()  # (N, K)
    return _rows_outer((q[:, None, :] * permuted[None]).sum(-1) * scales.float()[:, None], x)


def int4_nibbles(x, words, scales, mins, group_size):
    rows, count = words.shape  # count = K / 8
    groups = 8 * count // group_size
    x2 = _activations(x).view(1, -1, groups, group_size // 8, 8)  # (1, B, G, gs/8, 8)
    w = words.view(torch.int32).view(rows, 1, groups, group_size // 8, 1)  # one word feeds 8 lanes
    q = ((w >> (4 * torch.arange(8, dtype=torch.int32, device=x.device))) & 15).float()  # (N, 1, G, gs/8, 8)
    dq = q * scales.float().view(rows, 1, groups, 1, 1) + mins.float().view(rows, 1, groups, 1, 1)
    return _rows_outer((dq * x2).sum((-1, -2, -3)), x)


CANDIDATES = {
    LINEAR: {"aten": aten_linear, "reduce": reduce_linear},
    INT8: {"reduce-words": int8_words, "reduce-bytes": int8_bytes},
    INT4: {"reduce-nibbles": int4_nibbles},
}


@dataclass(frozen=True)
class WeightShape:
    """One distinct (op, rows, cols) read by the decode step; `group_size` for int4."""

    op: str
    rows: int
    cols: int
    group_size: int | None = None


def weight_shapes(exported) -> list[WeightShape]:
    """The distinct weight shapes of the exported decode graph's linear layers, in graph order."""
    shapes = []
    for node in exported.graph.nodes:
        if node.target == _ATEN:
            rows, cols = node.args[1].meta["val"].shape
            shape = WeightShape(LINEAR, rows, cols)
        elif node.target in (_INT8, _INT4):
            rows, count = node.args[1].meta["val"].shape
            op = INT8 if node.target == _INT8 else INT4
            shape = WeightShape(op, rows, count * WORD_FIELDS[op], node.args[4] if op == INT4 else None)
        else:
            continue
        if shape not in shapes:
            shapes.append(shape)
    return shapes


def _example(shape: WeightShape, rows: int, dtype: torch.dtype, device: str) -> tuple:
    """Random operands for timing: x (1, 1, K) and the tensors of a (rows, K) weight of shape's kind."""
    x = torch.randn(1, 1, shape.cols, device=device).to(dtype)
    if shape.op == LINEAR:
        return x, torch.randn(rows, shape.cols, device=device).to(dtype)
    count = shape.cols // WORD_FIELDS[shape.op]
    words = torch.randint(-(2**31), 2**31 - 1, (rows, count), dtype=torch.int32, device=device).view(torch.float32)
    if shape.op == INT8:
        return x, words, torch.rand(rows, device=device)
    groups = (rows, shape.cols // shape.group_size)
    scales, mins = (torch.rand(groups, device=device).to(SCALE_DTYPE[INT4]) for _ in range(2))
    return x, words, scales, mins, shape.group_size


def _weight_bytes(args: tuple) -> int:
    return sum(t.numel() * t.element_size() for t in args[1:] if isinstance(t, torch.Tensor))


# A decode step reads ~0.1-1 GB of weights, far more than any last-level cache, so every weight comes
# from memory. Timing one small weight over and over would time the cache instead, so a small shape is
# timed as a stack of copies (more rows, same columns) of at least this many bytes: the same kernel,
# streaming from memory, its per-call overhead spread thin.
_TIMED_BYTES = 96 << 20


def _timed_rows(shape: WeightShape, dtype) -> int:
    row_bytes = _weight_bytes(_example(WeightShape(shape.op, 1, shape.cols, shape.group_size), 1, dtype, "cpu"))
    copies = max(1, -(-_TIMED_BYTES // (row_bytes * shape.rows)))
    return shape.rows * copies


def _median_seconds(fn, args, repeats: int = 7) -> float:
    fn(*args)  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def fixed(shapes: list[WeightShape], dtype: torch.dtype, family: str) -> tuple[Lowering, ...]:
    """One family for every float weight without timing (quantized weights take their first kernel):
    for tests, and for portable bundles built on another machine than they will run on."""
    dtype_name = str(dtype).removeprefix("torch.")
    return tuple(
        Lowering(s.op, s.rows, s.cols, dtype_name, family if s.op == LINEAR else next(iter(CANDIDATES[s.op])), {})
        for s in shapes
    )


@torch.inference_mode()
def tune(
    shapes: list[WeightShape], dtype: torch.dtype, device: str, inductor_options: dict, log=print
) -> tuple[Lowering, ...]:
    """Time every candidate of every shape at batch 1 and keep the fastest. Each candidate is compiled
    with the bundle's own Inductor options (`aten` compiles to the same extern mm the graph calls)."""
    lowerings = []
    for shape in shapes:
        args = _example(shape, _timed_rows(shape, dtype), dtype, device)
        rates = {}
        for name, fn in CANDIDATES[shape.op].items():
            torch.compiler.reset()  # each candidate is a fresh compile, not a recompile of the last one
            compiled = torch.compile(fn, dynamic=False, fullgraph=True, options=inductor_options)
            with float_environment_kept():  # its .so is loaded on the first call
                rates[name] = round(_weight_bytes(args) / _median_seconds(compiled, args) / 1e9, 2)
        chosen = max(rates, key=rates.get)
        log(f"GEMV {shape.op} {shape.rows}x{shape.cols}: " + ", ".join(f"{k} {v} GB/s" for k, v in rates.items()))
        lowerings.append(Lowering(shape.op, shape.rows, shape.cols, str(dtype).removeprefix("torch."), chosen, rates))
    return tuple(lowerings)


def lower(exported, lowerings: tuple[Lowering, ...]):
    """The exported program with every linear layer replaced by its chosen lowering."""
    chosen = {(lw.op, lw.rows, lw.cols): CANDIDATES[lw.op][lw.chosen] for lw in lowerings}

    def linear(x, w, b=None):
        return chosen.get((LINEAR, *w.shape), aten_linear)(x, w, b)

    def woq_int8(x, words, scales):
        return chosen[(INT8, words.shape[0], words.shape[1] * WORD_FIELDS[INT8])](x, words, scales)

    def woq_int4(x, words, scales, mins, group_size):
        return chosen[(INT4, words.shape[0], words.shape[1] * WORD_FIELDS[INT4])](x, words, scales, mins, group_size)

    return exported.run_decompositions({_ATEN: linear, _INT8: woq_int8, _INT4: woq_int4})
