"""The integer kernels' two builds over a bundle's quantized weights, each held three ways: as the runtime
loads them (the bundle's file mapped), copied into fresh allocations, and copied then held as the exporter's
timing now holds them (exporter.timing.held_as_loaded). Weights called one at a time ("apart", as the builds'
race calls them) or a layer's siblings in one call ("grouped", as the decode graph calls them).

python held.py BUNDLE   (ms for the bundle's quantized weights at one activation row, interleaved runs)
"""

import sys

import torch

from exporter import kernels, quant_family
from exporter.lowering import gb_per_s, tensor_bytes
from exporter.timing import held_as_loaded, interleaved_seconds
from runtime.model.weights import read_weights
from runtime.quant import native

OPERANDS = {"int8": ("codes", "scales"), "int5": ("codes", "highs", "scales"), "int4": ("codes", "scales", "mins")}


def bundle_weights(bundle: str) -> list[tuple]:
    """(method, columns, operands, group size) of each quantized weight, the layers in order, the embedding
    (the tied lm_head) last."""
    stored = read_weights(f"{bundle}/model.safetensors")
    paths = sorted({k.rsplit(".packed.", 1)[0] for k in stored if ".packed." in k}, key=lambda p: ("embed" in p, p))
    weights = []
    for path in paths:
        method = "int4" if f"{path}.packed.mins" in stored else "int5" if f"{path}.packed.highs" in stored else "int8"
        operands = [stored[f"{path}.packed.{name}"] for name in OPERANDS[method]]
        columns = operands[0].shape[1] * (1 if method == "int8" else 2)
        weights.append((method, columns, operands, None if method == "int8" else 32))
    return weights


def calls(weights: list[tuple], library, grouped: bool) -> list:
    """Ready calls of `library`'s kernels over `weights` at one row: each apart, or consecutive weights of one
    method, width and group in one call (up to 4: a layer's q, k, v or gate, up; one activation per width)."""
    xs, runs, i = {}, [], 0
    while i < len(weights):
        method, columns, operands, group = weights[i]
        j = i + 1
        while grouped and j < len(weights) and j - i < 4 and weights[j][:2] == (method, columns):
            j += 1
        x = xs.setdefault(columns, torch.randn(1, columns))
        parts = [[w[2][k] for w in weights[i:j]] for k in range(len(operands))]
        runs.append(native.prepared_cat(method, x, parts, group, library)[0])
        i = j
    return runs


def in_turn(runs: list):
    def run():
        for call in runs:
            call()

    return run


def main(bundle: str) -> None:
    torch.set_num_threads(2)
    libraries = {name: kernels.build("native", log=print, serve=False, one_tile=one).library
                 for name, one in quant_family.BUILDS.items()}  # fmt: skip
    loaded = bundle_weights(bundle)
    copied = [(m, c, [torch.empty_like(t).copy_(t) for t in ops], g) for m, c, ops, g in loaded]
    flat = held_as_loaded([t for _, _, ops, _ in copied for t in ops])
    held = [(m, c, [flat.pop(0) for _ in ops], g) for m, c, ops, g in copied]
    size = tensor_bytes(t for _, _, ops, _ in loaded for t in ops)
    print(f"{bundle}: {len(loaded)} weights, {size / 1e6:.0f} MB")
    for label, weights in (("as loaded", loaded), ("copied", copied), ("held_as_loaded", held)):
        for grouped in (False, True):
            for repeat in range(2):
                fns = {name: in_turn(calls(weights, lib, grouped)) for name, lib in libraries.items()}
                timed = interleaved_seconds(fns, threads=2)
                rates = timed.best.items()
                figures = ", ".join(f"{n} {s * 1e3:.2f} ms ({gb_per_s(size, s):.1f} GB/s)" for n, s in rates)
                print(f"{label:15} {'grouped' if grouped else 'apart':8} {repeat}: {figures}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
