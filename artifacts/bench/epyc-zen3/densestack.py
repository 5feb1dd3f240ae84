"""Gemma 3 270M's linears through aotpack's `dense` GEMM (18 layers: qkv, o, gate+up, down, each its own weights,
streamed from memory; then lm_head) at several rows, each build's kernels interleaved in one process; ms a step.
HOT=1 loops one layer's weights (in L3).

    DT=bf16|f32 ROWS=1,4,8 ROUNDS=5 python densestack.py NAME=CSRC_DIR [NAME=CSRC_DIR ...]"""

import os
import statistics
import sys
import time
from pathlib import Path

import torch

from exporter import kernels
from runtime.quant import native

LAYER = [(1536, 640), (640, 1024), (4096, 640), (640, 2048)]
ROUNDS = int(os.environ.get("ROUNDS", "5"))
HOT = os.environ.get("HOT") == "1"
DT = torch.bfloat16 if os.environ.get("DT", "bf16") == "bf16" else torch.float32
ROWS = tuple(int(r) for r in os.environ.get("ROWS", "1,4,8").split(","))
CODE = native.DTYPE_CODES[DT]


def libraries() -> dict:
    built = {}
    for arg in sys.argv[1:]:
        name, folder = arg.split("=")
        kernels.SOURCES = Path(folder)
        built[name] = kernels.build(log=lambda _: None, serve=False, one_tile=True).library
    return built


def arguments(w: torch.Tensor, m: int):
    x = torch.randn(m, w.shape[1]).to(DT)
    y = torch.empty(m, w.shape[0], dtype=DT)
    return (x.data_ptr(), CODE, m, w.shape[1], w.data_ptr(), CODE, w.shape[0], y.data_ptr()), x, y


def main() -> None:
    libs = libraries()
    torch.manual_seed(0)
    layers = [[torch.randn(s).to(DT) for s in LAYER] for _ in range(1 if HOT else 18)] * (18 if HOT else 1)
    head = (torch.randn(262144, 640) * 0.05).to(DT)
    calls = {m: [arguments(w, m) for layer in layers for w in layer] for m in ROWS}
    heads = {m: arguments(head, m) for m in ROWS}
    outs = {}
    for name, lib in libs.items():
        for m in ROWS:
            lib._lib.aotpack_linear_dense(*heads[m][0])
            lib._lib.aotpack_linear_dense(*calls[m][3][0])
            outs[(name, m)] = (heads[m][2].clone(), calls[m][3][2].clone())
    same = all(torch.equal(outs[(a, m)][i], outs[(b, m)][i]) for a in libs for b in libs for m in ROWS for i in (0, 1))
    times = {}
    for _ in range(ROUNDS):
        for name, lib in libs.items():
            call = lib._lib.aotpack_linear_dense
            for m in ROWS:
                t0 = time.perf_counter()
                for args, _, _ in calls[m]:
                    call(*args)
                t1 = time.perf_counter()
                call(*heads[m][0])
                t2 = time.perf_counter()
                times.setdefault((name, m, "layers"), []).append((t1 - t0) * 1e3)
                times.setdefault((name, m, "head"), []).append((t2 - t1) * 1e3)
    for m in ROWS:
        median = {key: statistics.median(value) for key, value in times.items()}
        cells = [f"{n} layers {median[(n, m, 'layers')]:.2f} head {median[(n, m, 'head')]:.2f}" for n in libs]
        print(f"{DT} rows {m}: " + " | ".join(cells))
    print("same bits" if same else "the builds differ")


main()
