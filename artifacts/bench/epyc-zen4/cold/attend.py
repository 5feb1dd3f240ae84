"""aotpack's attention kernel from several source trees, interleaved in one process, cold (each call on its own
copy of the keys and values, 256 MB of them cycled): SmolLM2-135M's shapes at one row (3 KV heads of 64, 3 query
rows each) and Gemma 3 270M's at 8 rows (1 KV head of 256, 4 query rows), 5 rounds, median us a call.

    python attend.py NAME=CSRC_DIR [NAME=CSRC_DIR ...]"""

import statistics
import sys
import time
from pathlib import Path

import torch

from exporter import kernels
from runtime.quant import native

SHAPES = {"smollm2 1 row": (1, 3, 3, 64), "gemma 8 rows": (8, 1, 4, 256)}  # B, KV, R, D


def main() -> None:
    libs = {}
    for arg in sys.argv[1:]:
        name, folder = arg.split("=")
        kernels.SOURCES = Path(folder)
        libs[name] = kernels.build(log=lambda _: None, serve=False).library
    torch.manual_seed(0)
    res = {}
    for label, (b, kv, r, d) in SHAPES.items():
        for span in (128, 1536):
            copies = max(1, (256 << 20) // (2 * b * kv * span * d * 4))
            q = torch.randn(b, kv, r, d)
            kvs = [(torch.randn(b, kv, span, d), torch.randn(b, kv, span, d)) for _ in range(min(copies, 64))]
            mask = torch.ones(b, 1, 1, span, dtype=torch.bool)
            outs = [native.decode_attention(q, *kvs[0], mask, 0.125, lib) for lib in libs.values()]
            assert all(torch.allclose(o, outs[0], atol=1e-5) for o in outs)
            for _ in range(5):
                for name, lib in libs.items():
                    start = time.perf_counter()
                    for k, v in kvs:
                        native.decode_attention(q, k, v, mask, 0.125, lib)
                    res.setdefault((label, span, name), []).append((time.perf_counter() - start) / len(kvs) * 1e6)
    for (label, span, name), t in res.items():
        print(f"{label}, {span} keys, {name}: {statistics.median(t):.1f} us")


if __name__ == "__main__":
    main()
