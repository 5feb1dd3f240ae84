"""Integer kernels of two source trees, called through ctypes on Gemma 3 270M's shapes, interleaved.

python compare.py OLD.so,NEW.so [out.json]: each library's aotpack_linear_int8 / _int4 on random weights,
1, 2, 4 and 8 activation rows, 2 threads. The layer shapes cycle through ~300 MB of copies of the weight
(int4: ~150 MB), so that each call reads it from where a decode step does (L3 or memory, not L2); the
262144x640 lm_head is one copy. Microseconds a call, the median of 5 rounds, the libraries in turn each round.
"""

import json
import sys
import time
from pathlib import Path

import torch

from runtime.quant import int4_dot, int8_dot, native, tiles

SHAPES = [(1024, 640), (640, 1024), (2048, 640), (640, 2048), (262144, 640)]
GROUP = 32


def operands(scheme, n, k):
    if scheme == "int8":
        codes = int8_dot.arrange(torch.randint(-127, 128, (n, k), dtype=torch.int8)).contiguous()
        return codes, (torch.rand(n),), 300_000_000
    codes = int4_dot.arrange(torch.randint(0, 16, (n, k))).contiguous()
    side = tuple(tiles.tile_rows(torch.rand(n, k // GROUP).bfloat16()).contiguous() for _ in range(2))
    return codes, side, 150_000_000


def call_args(scheme, x, codes, side, y):
    m, k = x.shape
    n = y.shape[1]
    if scheme == "int8":
        return (x.data_ptr(), 0, m, k, codes.data_ptr(), side[0].data_ptr(), n, y.data_ptr())
    return (x.data_ptr(), 0, m, k, codes.data_ptr(), side[0].data_ptr(), side[1].data_ptr(), GROUP, n, y.data_ptr())


def main():
    paths = sys.argv[1].split(",")
    libs = {Path(p).stem: native.Library(Path(p)) for p in paths}
    torch.set_num_threads(2)
    results = []
    for scheme in ("int8", "int4"):
        for n, k in SHAPES:
            codes, side, footprint = operands(scheme, n, k)
            copies = [codes] if n > 100_000 else [codes.clone() for _ in range(max(1, footprint // (n * k)))]
            for m in (1, 2, 4, 8):
                x, y = torch.randn(m, k), torch.empty(m, n)
                outputs, times = {}, {name: [] for name in libs}
                for _ in range(5):
                    for name, lib in libs.items():
                        f = getattr(lib, f"aotpack_linear_{scheme}")
                        calls = [call_args(scheme, x, c, side, y) for c in copies]
                        reps = 10 if len(copies) == 1 else 1
                        for args in calls[:3]:
                            f(*args)
                        outputs[name] = y.clone()
                        start = time.perf_counter()
                        for _ in range(reps):
                            for args in calls:
                                f(*args)
                        times[name].append((time.perf_counter() - start) / len(calls) / reps * 1e6)
                first = next(iter(outputs.values()))
                same = all(torch.equal(first, o) for o in outputs.values())
                row = {"scheme": scheme, "shape": f"{n}x{k}", "rows": m, "same_bits": same}
                row |= {name: round(sorted(t)[2], 1) for name, t in times.items()}
                print(json.dumps(row), flush=True)
                results.append(row)
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
