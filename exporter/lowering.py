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

Quantized weights of the inductor family are read by fused dequantize-and-reduce kernels over
runtime.quant's packed words, each scheme's candidates defined in its own module (runtime.quant.int8:
whole words split with shifts, or bytes, whichever the CPU's vector loads favour; runtime.quant.int4:
one word at a time, broadcast to 8 lanes and split with per-lane shifts). ATen's weight-only ops
need layouts of their own (a second copy) and were slower on the 262144x640 shape here anyway
(`_weight_int8pack_mm` 17.5 ms against 15.0, `_weight_int4pack_mm_for_cpu` 13.2 ms against 12.9).
The integer family's op has one kernel, aotpack's own (runtime.quant.native): it stays in the graph,
AOTInductor calls its C shim, and its rate is timed and recorded like the others ("dot").

All lowerings put the weight rows outermost (output (rows, batch), transposed at the end), and reduce
each activation row as its own sum over the same weight (runtime.quant.kernels.each_row): in a graph of
static batch B, Inductor fuses the B sums so that each weight vector is loaded once, and converted or
dequantized once, for all B rows. Each graph's candidates are timed at its own batch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from exporter.timing import Interleaved, held_as_loaded, interleaved_seconds
from runtime.compat import float_environment_kept
from runtime.format.manifest import DENSE, DPBF16, KERNEL_LOWERINGS, TILES, Lowering
from runtime.format.quant import QuantSpec
from runtime.quant import SCHEMES
from runtime.quant import dense as dense_op
from runtime.quant.kernels import activations, each_row, rows_outer

LINEAR = "linear"
DOT = "dot"  # the integer family's one kernel: its op, left in the graph
_ATEN = torch.ops.aten.linear.default
_QUANTIZED = {scheme.op: scheme for scheme in SCHEMES.values()}  # each scheme's eager op -> the scheme
_NAMED = {scheme.name: scheme for scheme in SCHEMES.values()}  # "int8", "int4-dot", ... -> the scheme


def aten_linear(x, w, b=None):
    y = torch.matmul(x, w.t())  # ATen's mm, as the graph had it (not `linear`: that would recurse here)
    return y + b if b is not None else y


def reduce_linear(x, w, b=None):
    x2, wf = activations(x), w.float()  # (B, K), (N, K)
    y = rows_outer(each_row(lambda row: (wf * row).sum(-1), x2), x)  # (N, K) * (K,) per row
    return y + b if b is not None else y


def _own_gemm(op):
    """A linear through one of aotpack's GEMMs (runtime.quant.dense), whose C shims take row-major rows
    only: the other lowerings leave their output a transposed view (rows_outer), and Inductor passes a
    custom op the strides the trace saw, so they are made row-major here (a copy of a few KB; none at
    one row)."""

    def linear(x, w, b=None):
        y = op(x.contiguous(), w)
        return y + b if b is not None else y

    return linear


# aotpack's GEMM, on AMX tiles (bf16 only) and with AVX512-BF16's vdpbf16ps (bf16 only)
_OWN = {DENSE: _own_gemm(dense_op.OP), TILES: _own_gemm(dense_op.TILES_OP), DPBF16: _own_gemm(dense_op.DPBF16_OP)}


# Per op: its candidates by name. A float weight's are here; a quantized scheme's are its own module's,
# and the integer family's op is its own one candidate.
CANDIDATES = {LINEAR: {"aten": aten_linear, "reduce": reduce_linear, **_OWN}} | {
    scheme.name: scheme.candidates or {DOT: scheme.op} for scheme in SCHEMES.values()
}


@dataclass(frozen=True)
class WeightShape:
    """One distinct (op, rows, cols) read by the decode step: `op` LINEAR or a scheme's name; `group_size`
    for int4."""

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
        elif node.target in _QUANTIZED:
            scheme = _QUANTIZED[node.target]
            first = node.args[1].meta["val"]
            shape = WeightShape(scheme.name, first.shape[0], scheme.cols(first), scheme.spec_of(node.args).group_size)
        else:
            continue
        if shape not in shapes:
            shapes.append(shape)
    return shapes


def random_activations(shape: WeightShape, dtype: torch.dtype, device: str, batch: int = 1) -> torch.Tensor:
    """Random activations for `shape`'s weight: (batch, 1, K)."""
    return torch.randn(batch, 1, shape.cols, device=device).to(dtype)


def random_weight(shape: WeightShape, rows: int, dtype: torch.dtype, device: str) -> tuple:
    """The operands of a (rows, K) weight of shape's kind after x: its tensors (random bits in the
    scheme's layout) and the scheme's plain arguments."""
    if shape.op == LINEAR:
        return (torch.randn(rows, shape.cols, device=device).to(dtype),)
    scheme = _NAMED[shape.op]
    spec = QuantSpec(scheme.method, shape.group_size, scheme.kernels)
    first, *rest = scheme.shapes(spec, rows, shape.cols)
    raw = torch.randint(0, 256, (*first[:-1], first[-1] * scheme.dtypes[0].itemsize), dtype=torch.uint8)
    codes = raw.view(scheme.dtypes[0]).to(device)  # random bits in the first buffer's dtype
    scales = [_random(s, kind, device) for s, kind in zip(rest, scheme.dtypes[1:], strict=True)]
    return codes, *scales, *scheme.op_extras(spec)


def _random(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    """Random bits for an integer buffer (int5's fifth bits), values in [0, 1) for scales."""
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, dtype=dtype).to(device)
    return torch.rand(shape, device=device).to(dtype)


def tensor_bytes(tensors) -> int:
    """The bytes `tensors` hold (a weight's buffers, the weights a race reads)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def _buffer_bytes(operands) -> int:
    """The bytes of the tensors among a kernel's operands (not its plain arguments: a group size, a flag)."""
    return tensor_bytes(t for t in operands if isinstance(t, torch.Tensor))


def _weight_bytes(args: tuple) -> int:
    """The bytes of the weight timing operands hold (_timed_operands': all but x and the plain arguments)."""
    return _buffer_bytes(args[1:])


def gb_per_s(size: int, seconds: float) -> float:
    """`size` bytes in `seconds` as GB/s to four significant figures (two decimals at 10-99 GB/s, as the
    races' rates were): never 0 for a real rate (a tiny model's weights on a slow machine read at well
    under 0.005 GB/s, which two decimals made 0)."""
    return float(f"{size / seconds / 1e9:.4g}")


# A decode step reads ~0.1-1 GB of weights, far more than any last-level cache, so every weight comes
# from memory. Timing one small weight over and over would time the cache instead, so a small shape is
# timed as a stack of copies (more rows, same columns) of at least this many bytes: the same kernel,
# streaming from memory, its per-call overhead spread thin.
_TIMED_BYTES = 96 << 20
# Timed weights kept between graphs (_timed_weight), a shape and dtype each: a model's distinct linear
# shapes (Gemma 3 270M float32: 6, 1.2 GB in all) are written and synced once an export, not once a graph.
TIMED_WEIGHTS = 32


def _timed_rows(shape: WeightShape, dtype) -> int:
    row = random_weight(WeightShape(shape.op, 1, shape.cols, shape.group_size), 1, dtype, "cpu")
    row_bytes = _buffer_bytes(row)
    copies = max(1, -(-_TIMED_BYTES // (row_bytes * shape.rows)))
    return shape.rows * copies


def _timed_operands(shape: WeightShape, dtype: torch.dtype, device: str, batch: int) -> tuple:
    """Operands for timing `shape` at `batch`: fresh activations and _timed_weight's weight."""
    return random_activations(shape, dtype, device, batch), *_timed_weight(shape, dtype, device)


@functools.lru_cache(maxsize=TIMED_WEIGHTS)
def _timed_weight(shape: WeightShape, dtype: torch.dtype, device: str) -> tuple:
    """random_weight for `shape` (rows enough to stream from memory: _timed_rows), a CPU weight's tensors
    held as the runtime holds a bundle's (exporter.timing.held_as_loaded). Kept for the graphs after the
    first, which time the same shapes at other batches (forget_timed_weights)."""
    weight = random_weight(shape, _timed_rows(shape, dtype), dtype, device)
    if device != "cpu":
        return tuple(weight)
    tensors = iter(held_as_loaded([t for t in weight if torch.is_tensor(t)]))
    return tuple(next(tensors) if torch.is_tensor(t) else t for t in weight)


def forget_timed_weights() -> None:
    """Let the timed weights go (their files' space and pages): an export calls this once its graphs are
    tuned."""
    _timed_weight.cache_clear()


def fixed(shapes: list[WeightShape], dtype: torch.dtype, family: str) -> tuple[Lowering, ...]:
    """One family for every float weight without timing (quantized weights take their scheme's first
    kernel): for tests, and for portable bundles built on another machine than they will run on."""
    dtype_name = str(dtype).removeprefix("torch.")
    chosen = {s: family if s.op == LINEAR else next(iter(CANDIDATES[s.op])) for s in shapes}
    return tuple(Lowering(s.op, s.rows, s.cols, dtype_name, chosen[s], {}, {}, None) for s in shapes)


# When the timing cannot be trusted, the first of these a shape's candidates hold (known_good): for float
# weights aotpack's own GEMMs where the export has them, `dpbf16` for bf16 weights where it runs, else `dense`;
# the fused reduction without them (3x ATen on the AVX2 EPYC, level at batch 1 and 1.6-2x ahead at 4-8 rows
# on the AVX-512 Xeon). Against the fastest candidate's rate, three bf16 exports of Gemma 3 270M on the AMD
# EPYC Zen 4 (6 shapes, graphs of 1, 2, 4 and 8 rows): `dpbf16` 0.79-1.00 (1.00 at 4 and 8 rows), `dense`
# 0.53-1.00, the fused reduction 0.23-1.00 (0.23-0.40 at 8 rows; 0.72-1.00 at one). A quantized scheme keeps
# its first candidate.
KNOWN_GOOD = {LINEAR: (DPBF16, DENSE, "reduce")}


def known_good(op: str, candidates) -> str:
    """The candidate of `op` a timing judged noise keeps: KNOWN_GOOD's first among `candidates` (names), else
    the first of them."""
    return next((name for name in KNOWN_GOOD.get(op, ()) if name in candidates), next(iter(candidates)))


# Activation rows beyond which no fused reduction is a candidate: one reduction per row per layer, and
# SmolLM2's batch-8 verify graph (40 rows) spent over 15 minutes and 9 GB in Inductor's scheduler before
# it was stopped (its 5-row graph compiles in 3). ATen's mm and aotpack's GEMM remain.
MAX_FUSED_ROWS = 16


def candidates(op: str, batch: int, own: frozenset[str] = frozenset()) -> dict:
    """The candidates of `op` for a graph of `batch` activation rows: aotpack's GEMMs in `own` (those the
    export's kernels can run here: see exporter.export), fused reductions up to MAX_FUSED_ROWS rows."""
    if op != LINEAR:
        return CANDIDATES[op]
    dropped = set(KERNEL_LOWERINGS - own)
    dropped |= {"reduce"} if batch > MAX_FUSED_ROWS else set()
    return {name: fn for name, fn in CANDIDATES[op].items() if name not in dropped}


# Idle, each candidate's median call was within 3-8 % of its fastest and the process had 0.7 of its two
# cores; beside two busy loops, 26-55 % and 0.35 (measured on the AVX2 EPYC).
NOISY_SPREAD = 0.2
BUSY_CPU_SHARE = 0.5


@torch.inference_mode()
def tune(
    shapes: list[WeightShape],
    dtype: torch.dtype,
    device: str,
    inductor_options: dict,
    batch: int,
    log=print,
    own: frozenset[str] = frozenset(),
) -> tuple[Lowering, ...]:
    """Time every candidate of every shape at the graph's `batch`, interleaved, and keep the fastest, or
    the known-good candidate when the timing was noise. Each candidate is compiled with the graph's own
    Inductor options (`aten` compiles to the same extern mm the graph calls). `own`: aotpack's GEMMs that
    are candidates (see `candidates`)."""
    return tuple(_tuned(shape, dtype, device, inductor_options, batch, log, own) for shape in shapes)


def _tuned(shape: WeightShape, dtype, device: str, inductor_options: dict, batch: int, log, own) -> Lowering:
    args = _timed_operands(shape, dtype, device, batch)
    torch.compiler.reset()  # this shape's candidates are fresh compiles, not recompiles of the last shape's
    fns = {name: _runnable(fn, inductor_options) for name, fn in candidates(shape.op, batch, own).items()}
    with float_environment_kept():  # a compiled candidate's .so is loaded on the first call
        timed = interleaved_seconds(fns, *args, threads=torch.get_num_threads())
    rates = {name: gb_per_s(_weight_bytes(args), seconds) for name, seconds in timed.best.items()}
    noisy = noise_of(timed, cpu=device == "cpu") if len(rates) > 1 else None
    known = known_good(shape.op, rates)
    chosen = kept(timed, noisy, known, cpu=device == "cpu")
    spread = {name: round(value, 3) for name, value in timed.spread.items()}
    figures = ", ".join(f"{k} {v} GB/s (spread {spread[k]:.0%})" for k, v in rates.items())
    kept_why = f"; {noisy}: kept the known-good {chosen}" if noisy and chosen == known else ""
    if noisy and chosen != known:
        kept_why = f"; {noisy}, but the known-good {known} could not have won: kept {chosen}"
    log(f"GEMV {shape.op} {shape.rows}x{shape.cols} at batch {batch}: {figures}{kept_why}")
    return Lowering(shape.op, shape.rows, shape.cols, str(dtype).removeprefix("torch."), chosen, rates, spread, noisy)


def fastest(shape: WeightShape, dtype, device: str, inductor_options: dict, batch: int, log=print) -> str:
    """The candidate `tune` keeps for `shape` at `batch` (a shape with one candidate keeps it untimed)."""
    if len(CANDIDATES[shape.op]) == 1:
        return next(iter(CANDIDATES[shape.op]))
    return tune([shape], dtype, device, inductor_options, batch, log)[0].chosen


@torch.inference_mode()
def race(entrants: dict, dtype, device: str, batch: int) -> tuple[dict[str, float], str | None]:
    """Kernels that read weights of different layouts, `entrants`: name -> (shape, candidate, Inductor
    options), each on operands of its own layout, timed against each other in one interleaved run at
    `batch`. A candidate is a name in CANDIDATES, or a function run as it is (aotpack's kernels through a
    given build). Returns each one's rate (GB/s of its packed weight) and why the timing was noise (or None)."""
    fns, sizes = {}, {}
    torch.compiler.reset()
    for name, (shape, candidate, options) in entrants.items():
        args = _timed_operands(shape, dtype, device, batch)
        fn = candidate if callable(candidate) else _runnable(CANDIDATES[shape.op][candidate], options)
        fns[name], sizes[name] = functools.partial(fn, *args), _weight_bytes(args)
    with float_environment_kept():
        timed = interleaved_seconds(fns, threads=torch.get_num_threads())
    rates = {name: gb_per_s(sizes[name], seconds) for name, seconds in timed.best.items()}
    return rates, noise_of(timed, cpu=device == "cpu")


def noise_of(timed: Interleaved, cpu: bool = True) -> str | None:
    """Why these timings cannot name the fastest kernel (another process had the cores), or None. The
    CPU share speaks of CPU kernels only: a CUDA export's one launching thread leaves the others idle."""
    if cpu and timed.cpu_share < BUSY_CPU_SHARE:
        return f"the timing was noise (the export had {timed.cpu_share:.0%} of its cores)"
    winner = min(timed.best, key=timed.best.get)
    for name in sorted(timed.spread, key=timed.spread.get, reverse=True):
        if timed.spread[name] > NOISY_SPREAD and _within_reach(timed, name, winner):
            return f"the timing was noise ({name}'s median call {timed.spread[name]:.0%} over its fastest)"
    return None


def kept(timed: Interleaved, noisy: str | None, known: str, cpu: bool = True) -> str:
    """The candidate a timing keeps: the fastest; when the timing was noise, the known-good `known`, unless
    only a scattered candidate made it noise and `known` itself could not have won (its fastest call,
    slowed as much as its median one was, still loses). The scatter says another candidate might have
    beaten the fastest, not that a clear loser did: on the Xeon at 8 rows ATen's 21 % scatter had kept
    the fused reduction at 12 GB/s where aotpack's GEMM read 26."""
    winner = min(timed.best, key=timed.best.get)
    if noisy is None:
        return winner
    busy = cpu and timed.cpu_share < BUSY_CPU_SHARE
    return known if busy or known == winner or _within_reach(timed, known, winner) else winner


def _within_reach(timed: Interleaved, name: str, winner: str) -> bool:
    """Whether a scattered candidate might have won: its fastest call, if it was slowed as much as its
    median one was, beats the winner's. A clear loser's scatter (ATen at 60 % and a third of the
    winner's rate) leaves the choice standing; a scattered winner only ever ran slower than it is."""
    return name != winner and timed.best[name] / (1 + timed.spread[name]) < timed.best[winner]


def _runnable(fn, inductor_options: dict):
    """A candidate as the graph will run it: an Inductor lowering compiled with the graph's options, or
    aotpack's own kernels (the integer family's op, the dense GEMMs), the very kernels the graph calls
    (eagerly their call costs a few microseconds more, spread thin over the timed bytes)."""
    if fn in _QUANTIZED or fn in _OWN.values():
        return fn
    return torch.compile(fn, dynamic=False, fullgraph=True, options=inductor_options)


def lower(exported, lowerings: tuple[Lowering, ...]):
    """The exported program with every linear layer replaced by its chosen lowering."""
    chosen = {(lw.op, lw.rows, lw.cols): CANDIDATES[lw.op][lw.chosen] for lw in lowerings}

    def linear(x, w, b=None):
        return chosen.get((LINEAR, *w.shape), aten_linear)(x, w, b)

    def quantized(scheme):
        def woq(x, first, *rest):
            return chosen[(scheme.name, first.shape[0], scheme.cols(first))](x, first, *rest)

        return woq

    # The integer family's ops are left out: they stay in the graph, and AOTInductor calls their C shims.
    table = {_ATEN: linear} | {s.op: quantized(s) for s in SCHEMES.values() if s.candidates}
    return exported.run_decompositions(table)
