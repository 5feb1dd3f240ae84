"""aotpack's dense kernel from several builds, interleaved in one process: Gemma 3 270M's linears (the
262144 x 640 lm_head, and 18 layers' q, k, v, o, gate, up and down projections) at 1, 2, 4 and 8 activation
rows, fp32 and bf16 weights held as a bundle's (exporter.timing.held_as_loaded). ms, each build's fastest
call of 15 (exporter.timing.interleaved_seconds), two rounds.

    python fetch.py NAME=LIBRARY.so [NAME=LIBRARY.so ...]
"""

import sys
from pathlib import Path

import torch

from exporter.timing import held_as_loaded, interleaved_seconds
from runtime.quant import native

LAYER = ((1024, 640), (256, 640), (256, 640), (640, 1024), (2048, 640), (2048, 640), (640, 2048))


def weights(dtype: torch.dtype) -> tuple[torch.Tensor, list[torch.Tensor]]:
    head, *layers = held_as_loaded([(torch.randn(n, k) * 0.02).to(dtype) for n, k in ((262144, 640), *LAYER * 18)])
    return head, layers


def calls(lib: native.Library, rows: int, head: torch.Tensor, layers: list[torch.Tensor]) -> dict:
    """The lm_head's call and the layers' calls on `lib` at `rows` activation rows."""
    xs = {k: torch.randn(rows, k, dtype=head.dtype) for k in (640, 1024, 2048)}
    return {
        "lm_head": lambda: native.linear_dense(xs[640], head, lib),
        "layers": lambda: [native.linear_dense(xs[w.shape[1]], w, lib) for w in layers],
    }


def main(builds: dict[str, native.Library]) -> None:
    torch.set_num_threads(2)
    for dtype in (torch.float32, torch.bfloat16):
        head, layers = weights(dtype)
        for round_ in range(2):
            for rows in (1, 2, 4, 8):
                fns = {f"{name} {what}": fn for name, lib in builds.items()
                       for what, fn in calls(lib, rows, head, layers).items()}  # fmt: skip
                best = interleaved_seconds(fns, threads=2).best
                figures = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in best.items())
                print(f"{str(dtype)[6:]:8} round {round_} rows {rows}: {figures}", flush=True)


if __name__ == "__main__":
    main({arg.split("=")[0]: native.Library(Path(arg.split("=", 1)[1])) for arg in sys.argv[1:]})
