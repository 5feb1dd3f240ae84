"""A bundle's int8 linears called in its graph's order (every layer's, then the `lm_head`), on the bundle's own
weights, with the integer kernels built from each source tree given, interleaved in one process (each build has
its own soname, so each call reaches its own library).

    python stack.py BUNDLE NAME=CSRC_DIR [NAME=CSRC_DIR ...]

A NAME ending in "1t" builds its tree with one weight tile a pass. ROWS (default "1 8"), ROUNDS (12) and ISA (an
instruction path to build, e.g. "avx2"; default the host's) from the environment. Every build must give the same
bits."""

import gc
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

from exporter import kernels
from runtime import load
from runtime.quant import native
from runtime.quant.modules import QuantizedLinear


def main() -> None:
    load(sys.argv[1])
    model = next(o for o in gc.get_objects() if isinstance(o, nn.Module) and hasattr(o, "get_decoder"))
    linears = [m.packed.tensors() for m in model.modules() if isinstance(m, QuantizedLinear)]
    libs = {}
    for arg in sys.argv[2:]:
        name, folder = arg.split("=")
        kernels.SOURCES = Path(folder)
        isa = os.environ.get("ISA")
        built = kernels.build(isa_override=isa, log=lambda _: None, serve=False, one_tile=name.endswith("1t"))
        libs[name] = built.library
    rows = tuple(int(v) for v in os.environ.get("ROWS", "1 8").split())
    xs = {(m, c): torch.randn(m, c) for m in rows for c in {t[0].shape[1] for t in linears}}
    first = [native.linear_int8(xs[(rows[-1], linears[0][0].shape[1])], *linears[0], lib) for lib in libs.values()]
    assert all(torch.equal(y, first[0]) for y in first), "the builds differ"
    res: dict = {}
    for _ in range(int(os.environ.get("ROUNDS", "12"))):
        for name, lib in libs.items():
            for m in rows:
                start = time.perf_counter()
                for t in linears[:-1]:
                    native.linear_int8(xs[(m, t[0].shape[1])], *t, lib)
                mid = time.perf_counter()
                native.linear_int8(xs[(m, linears[-1][0].shape[1])], *linears[-1], lib)
                end = time.perf_counter()
                res.setdefault((name, m, "layers"), []).append((mid - start) * 1e3)
                res.setdefault((name, m, "lm_head"), []).append((end - mid) * 1e3)
    for name in libs:
        med = {(m, part): statistics.median(res[(name, m, part)]) for m in rows for part in ("layers", "lm_head")}
        cells = [f"{m} rows: layers {med[(m, 'layers')]:.2f}, lm_head {med[(m, 'lm_head')]:.2f}" for m in rows]
        print(name, " | ".join(cells), "(ms, medians)")


main()
