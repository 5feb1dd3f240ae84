"""aotpack's decode attention from several source trees, interleaved in one process, cold (each call on its own
copy of the keys and values, 256 MB of them cycled), 15 rounds, median us a call; and whether every tree gives
the same bits (fp32, bf16 and fp16 queries, strided ones, fp32 and bf16 caches, split and unsplit keys).

    python attend.py NAME=CSRC_DIR [NAME=CSRC_DIR ...]"""

import statistics
import sys
import time
from pathlib import Path

import torch

from exporter import kernels
from runtime.quant import native

SHAPES = {"smollm2 1 row": (1, 3, 3, 64), "gemma 1 row": (1, 1, 4, 256), "gemma 8 rows": (8, 1, 4, 256)}  # B, KV, R, D
SPANS = (1, 64, 300, 1536)
BITS = [
    (1, 1, 4, 1, 97, 256),
    (8, 1, 4, 1, 300, 256),
    (1, 1, 4, 1, 3000, 64),
    (2, 1, 6, 3, 130, 24),
    (1, 1, 1, 1, 300, 7),
    (1, 3, 32, 16, 40, 32),
    (8, 2, 4, 1, 2348, 16),
]  # B, KV, R, T, S, D


def same_bits(libs) -> bool:
    g = torch.Generator().manual_seed(0)
    same = True
    for b, kv, r, t, s, d in BITS:
        for qt in (torch.float32, torch.bfloat16, torch.float16):
            for kt in (torch.float32, torch.bfloat16):
                k, v = (torch.randn(b, kv, s, d, generator=g).to(kt) for _ in range(2))
                mask = torch.rand(b, 1, t, s, generator=g) > 0.2
                mask[0, 0, :, : s // 2] = False
                for q in (
                    torch.randn(b, kv, r, d, generator=g).to(qt),
                    torch.randn(b, r, kv, d, generator=g).to(qt).transpose(1, 2),
                ):
                    outs = [native.decode_attention(q, k, v, mask, 0.125, lib).float() for lib in libs.values()]
                    same &= all(torch.equal(o.view(torch.int32), outs[0].view(torch.int32)) for o in outs)
    return same


def main() -> None:
    libs = {}
    for arg in sys.argv[1:]:
        name, folder = arg.split("=")
        kernels.SOURCES = Path(folder)
        libs[name] = kernels.build(log=lambda _: None, serve=False).library
    print("same bits:", same_bits(libs))
    torch.manual_seed(0)
    res = {}
    for label, (b, kv, r, d) in SHAPES.items():
        for span in SPANS:
            copies = max(1, (256 << 20) // (2 * b * kv * span * d * 4))
            q = torch.randn(b, kv, r, d)
            kvs = [(torch.randn(b, kv, span, d), torch.randn(b, kv, span, d)) for _ in range(min(copies, 64))]
            mask = torch.ones(b, 1, 1, span, dtype=torch.bool)
            for _ in range(15):
                for name, lib in libs.items():
                    start = time.perf_counter()
                    for k, v in kvs:
                        native.decode_attention(q, k, v, mask, 0.125, lib)
                    res.setdefault((label, span, name), []).append((time.perf_counter() - start) / len(kvs) * 1e6)
    for (label, span, name), t in res.items():
        print(f"{label}, {span} keys, {name}: {statistics.median(t):.1f} us")


if __name__ == "__main__":
    main()
