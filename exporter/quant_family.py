"""Which kernel family computes a quantized bundle's layers, chosen on the build machine.

Owns the choice between aotpack's integer kernels and Inductor's dequantizing reductions
(runtime.format.quant). With `--quant-kernels auto` both are timed on the bundle's largest weight at its
main method, at batch 1 and at the bundle's largest batch, each as the decode graph would run it (each
family's fastest candidate, raced against the other's in one interleaved run, as the GEMV tuning times
its candidates: exporter.lowering.race), and the family with the smaller total time wins; the rates go
in the manifest (`quantization.kernel_rates`). When the timing was noise (the export did not get its
cores, or a kernel's calls spread widely), the known-good family is kept, and the manifest says why
(`quantization.kernel_noise`). The
choice is per bundle, not per weight: the two families compute different numbers (the integer family
quantizes the activations too) and store different layouts, and the eager prefill must compute what
every decode graph computes. CUDA bundles take Inductor's: the integer kernels are CPU code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from exporter import kernels
from exporter.compile import kernel_options
from exporter.config import ExportConfig
from exporter.lowering import WeightShape, fastest, race
from runtime.format.manifest import Quantization
from runtime.format.quant import INDUCTOR, INTEGER, QuantSpec
from runtime.quant import scheme

# Kept when the timing is noise: the family that won at batch 1 on every idle machine measured (on the AVX2
# EPYC, aotpack's kernels decode int8 and int4 at 1.36x and 1.38x llama.cpp's; Inductor's, 0.97x and 0.80x).
KNOWN_GOOD = INTEGER


@dataclass(frozen=True)
class Family:
    kernels: str  # INTEGER or INDUCTOR
    rates: dict[str, float]  # "<family>@<batch>": GB/s on the timed weight; {} when not timed
    built: kernels.Built | None  # the integer kernels, when they are the family
    noise: str | None = None  # why the timing was not trusted (KNOWN_GOOD kept), or None


def choose(config: ExportConfig, plan: Quantization, shapes: dict[str, tuple[int, int]], log=print) -> Family:
    """`plan`: the bundle's quantization as planned; `shapes`: each quantized module's (rows, cols)."""
    if config.device != "cpu":
        return Family(INDUCTOR, {}, None)
    if config.quant_kernels == INDUCTOR:
        return Family(INDUCTOR, {}, None)
    built = kernels.build(config.cpu_isa, log=log)
    if config.quant_kernels == INTEGER:
        return Family(INTEGER, {}, built)
    main = [shape for path, shape in shapes.items() if plan.spec(path).method == plan.method]
    rows, cols = max(main, key=lambda s: s[0] * s[1])
    dtype, rates, noise = getattr(torch, config.dtype), {}, []
    for batch in sorted({1, config.batch_size}):
        entrants = {}
        for family in (INTEGER, INDUCTOR):
            shape = WeightShape(
                scheme(QuantSpec(plan.method, plan.group_size, family)).name, rows, cols, plan.group_size
            )
            options = kernel_options(config.device, config.cpu_isa, dequantizing=family == INDUCTOR)
            entrants[family] = (shape, fastest(shape, dtype, config.device, options, batch, log), options)
        raced, noisy = race(entrants, dtype, config.device, batch)
        rates |= {f"{family}@{batch}": rate for family, rate in raced.items()}
        noise += [f"at batch {batch}, {noisy}"] if noisy else []
    seconds = {f: sum(1 / rate for key, rate in rates.items() if key.startswith(f)) for f in (INTEGER, INDUCTOR)}
    chosen = KNOWN_GOOD if noise else min(seconds, key=seconds.get)
    kept = f"; {'; '.join(noise)}: kept the known-good {chosen}" if noise else ""
    log(f"quantized layers: {chosen} kernels ({', '.join(f'{k} {v} GB/s' for k, v in rates.items())}){kept}")
    return Family(chosen, rates, built if chosen == INTEGER else None, "; ".join(noise) or None)
