"""aotpack's decode attention built from each source tree given, interleaved in one process: Gemma 3 270M's
shapes (one KV head, 4 query rows a row, head dim 256), B rows (default 8), spans of 64, 512 and 2,000 keys,
NL layers' 2,048-slot caches (default 12) cycled so the keys and values come from memory; GB/s of them read.

    python attention.py NAME=CSRC_DIR [NAME=CSRC_DIR ...]

Every build must give the same bits."""

import os
import statistics
import sys
import time
from pathlib import Path

import torch

from exporter import kernels
from runtime.quant import native

SPANS = (64, 512, 2000)


def main() -> None:
    libs = {}
    for arg in sys.argv[1:]:
        name, folder = arg.split("=")
        kernels.SOURCES = Path(folder)
        libs[name] = kernels.build(log=lambda _: None, serve=False).library
    torch.manual_seed(0)
    b, layers = int(os.environ.get("B", "8")), int(os.environ.get("NL", "12"))
    caches = [(torch.randn(b, 1, 2048, 256), torch.randn(b, 1, 2048, 256)) for _ in range(layers)]
    q = torch.randn(b, 1, 4, 256)
    masks = {s: torch.ones(b, 1, 1, s, dtype=torch.bool) for s in SPANS}
    k, v = caches[0]
    outs = [native.decode_attention(q, k[:, :, :512], v[:, :, :512], masks[512], 0.0625, lib) for lib in libs.values()]
    assert all(torch.equal(o, outs[0]) for o in outs), "the builds differ"
    res: dict = {}
    for _ in range(6):
        for name, lib in libs.items():
            for s in SPANS:
                times = []
                for i in range(36):
                    k, v = caches[i % layers]
                    start = time.perf_counter()
                    native.decode_attention(q, k[:, :, :s], v[:, :, :s], masks[s], 0.0625, lib)
                    times.append(time.perf_counter() - start)
                res.setdefault((name, s), []).append(statistics.median(times))
    for s in SPANS:
        cells = []
        for name in libs:
            sec = statistics.median(res[(name, s)])
            cells.append(f"{name} {sec * 1e6:.0f} us {b * s * 256 * 4 * 2 / sec / 1e9:.1f} GB/s")
        print(f"{s} keys:", " | ".join(cells))


main()
