"""Which kernel family computes a quantized bundle's layers, chosen on the build machine.

Owns the choice between aotpack's integer kernels and Inductor's dequantizing reductions
(runtime.format.quant). With `--quant-kernels auto` both are timed on the bundle's largest weight at its
main method, at batch 1 and at the bundle's largest batch, each as the decode graph would run it (each
family's fastest candidate, raced against the other's in one interleaved run, as the GEMV tuning times
its candidates: exporter.lowering.race), and the family with the smaller total time wins; the rates go
in the manifest (`quantization.kernel_rates`). When the timing was noise (the export did not get its
cores, or a kernel's calls spread widely) in RACES runs in a row, the known-good family is kept, and the
manifest says why (`quantization.kernel_noise`). First the integer kernels' two builds (several weight
tiles a pass or one: exporter/csrc/lanes.h, the same bits) race over a decode step's worth of the
bundle's weights, and the faster one is the family's entrant, serves the export's eager op and goes in
the bundle: which wins depends on the CPU and on the model's shapes. The
choice is per bundle, not per weight: the two families compute different numbers (the integer family
quantizes the activations too) and store different layouts, and the eager prefill must compute what
every decode graph computes. CUDA bundles take Inductor's: the integer kernels are CPU code.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from exporter import kernels
from exporter.compile import kernel_options
from exporter.config import ExportConfig
from exporter.lowering import (
    CANDIDATES,
    DOT,
    WeightShape,
    fastest,
    gb_per_s,
    noise_of,
    race,
    random_weight,
    tensor_bytes,
)
from exporter.timing import held_as_loaded, interleaved_seconds
from runtime.compat import float_environment_kept
from runtime.format.manifest import Quantization
from runtime.format.quant import INDUCTOR, INTEGER, METHODS, QuantSpec
from runtime.quant import native, scheme

# Kept when the timing is noise: the family that won at batch 1 on every idle machine measured (on the AVX2
# EPYC, aotpack's kernels decode int8 and int4 at 1.36x and 1.38x llama.cpp's; Inductor's, 0.97x and 0.80x).
KNOWN_GOOD = INTEGER
# The integer kernels' builds (exporter.kernels.build's one_tile), and the one kept when their timing is
# noise: several tiles a pass won on the machines before the AMD EPYC Zen 5, where one tile won.
BUILDS = {"tiles": False, "one-tile": True}
KNOWN_GOOD_BUILD = "tiles"
# Runs of a race before its noise keeps the known-good: on a shared 2-core VM one run in two or three met
# another process. The AMD EPYC Zen 4's export of Gemma 3 270M int8 kept tiles on a race at batch 8 that
# was noise, where one-tile had read 1.35x tiles' rate at batch 1: its batch-1 graph then stepped in 9.4
# ms against one-tile's 8.3 (each build's bundle, the graphs called directly, interleaved, 6 rounds).
RACES = 3
# The builds' race holds a random copy of a step's weights: up to this many bytes of them, the layers in
# order (all of a model of half a billion int8 weights; a larger model's first layers, which call the same
# shapes as the rest).
STEP_BYTES = 512 << 20


@dataclass(frozen=True)
class Family:
    kernels: str  # INTEGER or INDUCTOR
    # "<family>@<batch>": GB/s on the timed weight, "<build>@<batch>" over a step's weights; {} when not timed
    rates: dict[str, float]
    built: kernels.Built | None  # the integer kernels, when they are the family
    noise: str | None = None  # why the timing was not trusted (KNOWN_GOOD kept), or None


def choose(config: ExportConfig, plan: Quantization, shapes: dict[str, tuple[int, int]], log=print) -> Family:
    """`plan`: the bundle's quantization as planned; `shapes`: each quantized module's (rows, cols)."""
    if config.device != "cpu" or config.quant_kernels == INDUCTOR:
        return Family(INDUCTOR, {}, None)
    method, group, (rows, cols) = _timed_weight(plan, shapes)
    dtype = getattr(torch, config.dtype)
    integer = WeightShape(scheme(QuantSpec(method, group, INTEGER)).name, rows, cols, group)
    built, build_rates, build_noise = _integer_build(config, _step_weights(plan, shapes), dtype, log)
    if config.quant_kernels == INTEGER:
        return Family(INTEGER, build_rates, built, build_noise)
    inductor = replace(integer, op=scheme(QuantSpec(method, group, INDUCTOR)).name)
    options = kernel_options(config.device, config.cpu_isa, dequantizing=True)
    entrants = functools.cache(lambda batch: {  # tuned once a batch, however often its race runs
        INTEGER: (integer, _through(built.library, integer), {}),
        INDUCTOR: (inductor, fastest(inductor, dtype, config.device, options, batch, log), options),
    })  # fmt: skip
    chosen, rates, noise = _faster(lambda batch: race(entrants(batch), dtype, config.device, batch), config, KNOWN_GOOD)
    kept = f"; {'; '.join(noise)}: kept the known-good {chosen}" if noise else ""
    log(f"quantized layers: {chosen} kernels ({', '.join(f'{k} {v} GB/s' for k, v in rates.items())}){kept}")
    rates |= build_rates
    noise += [build_noise] if build_noise else []
    return Family(chosen, rates, built if chosen == INTEGER else None, "; ".join(noise) or None)


def _timed_weight(plan: Quantization, shapes: dict[str, tuple[int, int]]) -> tuple[str, int | None, tuple[int, int]]:
    """(method, group size, (rows, cols)) of the weight the races time: the largest at the bundle's method,
    else the largest at a method both families have (a mixed int4 bundle of narrow weights holds them all
    at int5, which Inductor's family lacks, or int8)."""
    for methods in ((plan.method,), METHODS):
        found = [(plan.spec(path), shape) for path, shape in shapes.items() if plan.spec(path).method in methods]
        if found:
            spec, shape = max(found, key=lambda f: f[1][0] * f[1][1])
            return spec.method, spec.group_size, shape
    raise ValueError("a quantized bundle without a quantized weight")  # plan() quantizes the lm_head at least


def _integer_build(config: ExportConfig, weights: list, dtype, log) -> tuple[kernels.Built, dict, str | None]:
    """The integer kernels' faster build here, which then serves the eager op: several weight tiles a pass
    (the known-good) or one (exporter/csrc/lanes.h, tiles_a_pass; the same bits), raced over `weights`
    (_step_weights) at batch 1 and at the bundle's batch. Returns it, the builds' rates ("<build>@<batch>",
    GB/s over those weights) and why the timing was noise (the known-good kept), or None."""
    builds = {name: kernels.build(config.cpu_isa, log=log, serve=False, one_tile=one) for name, one in BUILDS.items()}
    libraries = {name: b.library for name, b in builds.items()}
    chosen, rates, noise = _faster(
        lambda batch: _race_step(libraries, weights, dtype, batch), config, KNOWN_GOOD_BUILD, "integer builds "
    )
    log(f"integer kernels: {chosen} ({', '.join(f'{k} {v} GB/s' for k, v in rates.items())})")
    native.register(builds[chosen].library)
    return builds[chosen], rates, "; ".join(noise) + f": kept {chosen}" if noise else None


def _step_weights(plan: Quantization, shapes: dict[str, tuple[int, int]]) -> list[tuple]:
    """A decode step's worth of weights for the builds' race: each quantized linear layer's, in the plan's
    order, as random bits of its shape and method in the integer family's layout (method, columns,
    operands, group size), up to STEP_BYTES, held as the runtime holds a bundle's (one file's mapping:
    exporter.timing.held_as_loaded). A step's calls of small weights cost more than their bytes, and the
    build that streams one big weight faster is not always the one that steps faster: SmolLM2-135M int8
    on an AMD EPYC Zen 4, raced on its lm_head alone, kept tiles (36.6 against 35.0 GB/s), whose step
    took 7.1 ms against one-tile's 6.0 (artifacts/bench/epyc-zen4/fused/)."""
    weights, size = [], 0
    for path in plan.linears:
        spec, (rows, cols) = plan.spec(path), shapes[path]
        integer = scheme(QuantSpec(spec.method, spec.group_size, INTEGER))
        operands = random_weight(WeightShape(integer.name, rows, cols, spec.group_size), rows, torch.float32, "cpu")
        tensors = [t for t in operands if torch.is_tensor(t)]
        size += tensor_bytes(tensors)
        if weights and size > STEP_BYTES:
            break
        weights.append((spec.method, cols, tensors, spec.group_size))
    held = iter(held_as_loaded([t for *_, tensors, _ in weights for t in tensors]))
    return [(method, cols, [next(held) for _ in tensors], group) for method, cols, tensors, group in weights]


@torch.inference_mode()
def _race_step(libraries: dict[str, native.Library], weights: list, dtype, batch: int) -> tuple[dict, str | None]:
    """Each library's kernels over every one of `weights` in turn (`batch` activation rows), called as the
    decode graph calls them (no dispatcher: native.prepared_cat), raced in one interleaved run: (each one's
    GB/s over the weights' bytes, why the timing was noise or None)."""
    xs, calls = {}, {name: [] for name in libraries}
    for method, cols, operands, group in weights:
        x = xs.setdefault(cols, torch.randn(batch, cols).to(dtype))  # (batch, cols)
        for name, library in libraries.items():
            calls[name].append(native.prepared_cat(method, x, [[t] for t in operands], group, library)[0])

    def step(runs):
        def run():
            for call in runs:
                call()

        return run

    with float_environment_kept():
        timed = interleaved_seconds({name: step(runs) for name, runs in calls.items()}, threads=torch.get_num_threads())
    size = tensor_bytes(t for _, _, operands, _ in weights for t in operands)
    return {name: gb_per_s(size, seconds) for name, seconds in timed.best.items()}, noise_of(timed)


def _faster(race_at, config: ExportConfig, known_good: str, what: str = "") -> tuple[str, dict, list[str]]:
    """`race_at(batch)` (its entrants' rates and why the timing was noise, or None: exporter.lowering.race)
    at batch 1 and at the bundle's batch, each race run again while it is noise (RACES runs at most): the
    entrant with the smaller total time (`known_good` when a race stayed noise), the rates
    ("<entrant>@<batch>") and each such race's last verdict (`what` names the race in it)."""
    rates, noise = {}, []
    for batch in sorted({1, config.batch_size}):
        for _ in range(RACES):
            raced, noisy = race_at(batch)
            if noisy is None:
                break
        rates |= {f"{name}@{batch}": rate for name, rate in raced.items()}
        noise += [f"{what}at batch {batch}, {noisy}"] if noisy else []
    seconds = {name: sum(1 / rate for key, rate in rates.items() if key.startswith(f"{name}@")) for name in raced}
    return (known_good if noise else min(seconds, key=seconds.get)), rates, noise


def _through(library: native.Library, shape: WeightShape):
    """The integer family's op for `shape`, run on `library` (whichever build serves the process)."""
    op = CANDIDATES[shape.op][DOT]

    def run(*args):
        with native.serving(library):
            return op(*args)

    return run
