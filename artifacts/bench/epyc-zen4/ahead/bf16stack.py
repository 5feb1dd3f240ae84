"""Gemma 3 270M's bf16 linears as a decode step calls them through `dpbf16` (18 layers: qkv, o, gate+up, down, each
its own weights, streamed from memory; then lm_head), each build's kernels interleaved in one process, at 1 and 8
rows; ms a step. HOT=1 loops one layer's weights (in cache).

    python bf16stack.py NAME=CSRC_DIR [NAME=CSRC_DIR ...]"""

import os
import statistics
import sys
import time
from pathlib import Path

import torch

from exporter import kernels
from runtime.quant import native

LAYER = [(1536, 640), (640, 1024), (4096, 640), (640, 2048)]
ROUNDS = int(os.environ.get("ROUNDS", "11"))
HOT = os.environ.get("HOT") == "1"
BF16 = native.DTYPE_CODES[torch.bfloat16]


def libraries() -> dict:
    built = {}
    for arg in sys.argv[1:]:
        name, folder = arg.split("=")
        kernels.SOURCES = Path(folder)
        built[name] = kernels.build(log=lambda _: None, serve=False, one_tile=True).library
    return built


def arguments(w: torch.Tensor, x: torch.Tensor):
    y = torch.empty(x.shape[0], w.shape[0], dtype=torch.bfloat16)
    return (x.data_ptr(), BF16, x.shape[0], w.shape[1], w.data_ptr(), BF16, w.shape[0], y.data_ptr()), y


def main() -> None:
    libs = libraries()
    torch.manual_seed(0)
    layers = [[torch.randn(s).to(torch.bfloat16) for s in LAYER] for _ in range(1 if HOT else 18)] * (18 if HOT else 1)
    head = torch.randn(262144, 640).to(torch.bfloat16) * 0.05
    xs = {(m, k): torch.randn(m, k).to(torch.bfloat16) for m in (1, 8) for k in (640, 1024, 2048)}
    calls = {m: [arguments(w, xs[(m, w.shape[1])]) for layer in layers for w in layer] for m in (1, 8)}
    heads = {m: arguments(head, xs[(m, 640)]) for m in (1, 8)}
    outputs = []
    for lib in libs.values():
        for m in (1, 8):
            lib._lib.aotpack_linear_dpbf16(*calls[m][3][0])
            lib._lib.aotpack_linear_dpbf16(*heads[m][0])
            outputs.append((m, calls[m][3][1].clone(), heads[m][1].clone()))
    same = all(torch.equal(a, b) and torch.equal(c, d) for m, a, c in outputs for n, b, d in outputs if m == n)
    times = {}
    for _ in range(ROUNDS):
        for name, lib in libs.items():
            call = lib._lib.aotpack_linear_dpbf16
            for m in (1, 8):
                t0 = time.perf_counter()
                for args, _ in calls[m]:
                    call(*args)
                t1 = time.perf_counter()
                call(*heads[m][0])
                t2 = time.perf_counter()
                times.setdefault((name, m, "layers"), []).append((t1 - t0) * 1e3)
                times.setdefault((name, m, "head"), []).append((t2 - t1) * 1e3)
    for part in ("layers", "head"):
        cells = [
            f"{n} m1 {statistics.median(times[(n, 1, part)]):.3f} m8 {statistics.median(times[(n, 8, part)]):.3f}"
            for n in libs
        ]
        print(part, " | ".join(cells))
    print("same bits" if same else "the builds differ")


main()
