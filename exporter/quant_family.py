"""Which kernel family computes a quantized bundle's layers, chosen on the build machine.

Owns the choice between aotpack's integer kernels and Inductor's dequantizing reductions
(runtime.format.quant). With `--quant-kernels auto` both are timed on the bundle's largest weight at its
main method, at batch 1 and at the bundle's largest batch, each as the decode graph would run it, and the
family with the smaller total time wins; the rates go in the manifest (`quantization.kernel_rates`). The
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
from exporter.lowering import WeightShape, tune
from runtime.format.manifest import Quantization
from runtime.format.quant import INDUCTOR, INTEGER, QuantSpec
from runtime.quant import scheme


@dataclass(frozen=True)
class Family:
    kernels: str  # INTEGER or INDUCTOR
    rates: dict[str, float]  # "<family>@<batch>": GB/s on the timed weight; {} when not timed
    built: kernels.Built | None  # the integer kernels, when they are the family


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
    rates = {}
    for batch in sorted({1, config.batch_size}):
        for family in (INTEGER, INDUCTOR):
            spec = QuantSpec(plan.method, plan.group_size, family)
            shape = WeightShape(scheme(spec).name, rows, cols, plan.group_size)
            options = kernel_options(config.device, config.cpu_isa, dequantizing=family == INDUCTOR)
            (timed,) = tune([shape], getattr(torch, config.dtype), config.device, options, batch, log)
            rates[f"{family}@{batch}"] = max(timed.gb_per_s.values())
    seconds = {f: sum(1 / rate for key, rate in rates.items() if key.startswith(f)) for f in (INTEGER, INDUCTOR)}
    chosen = min(seconds, key=seconds.get)
    log(f"quantized layers: {chosen} kernels ({', '.join(f'{k} {v} GB/s' for k, v in rates.items())})")
    return Family(chosen, rates, built if chosen == INTEGER else None)
