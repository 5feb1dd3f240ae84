"""linear_dpbf16's outputs from two or more csrc trees on the same operands: 184 calls (N 1-262,144, K 1-1,000,
M 1-17, NaN, infinities, subnormals and overflows in the operands), each tree's bits against the first's, any
NaN counted as one (its payload follows the compiler's operand order).

    python bits.py NAME=CSRC_DIR NAME=CSRC_DIR [...]"""

import sys
from pathlib import Path

import torch

from exporter import kernels
from runtime.quant import native

BF16 = native.DTYPE_CODES[torch.bfloat16]
SPECIAL = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e-40, -1e-39, 0.0, 3e38])
SHAPES = [(n, k) for n in (1, 3, 7, 301, 24577, 40000) for k in (1, 31, 33, 640, 1000)] + [(262144, 64), (262144, 640)]


def libraries() -> dict:
    built = {}
    for arg in sys.argv[1:]:
        name, folder = arg.split("=")
        kernels.SOURCES = Path(folder)
        built[name] = kernels.build(log=lambda _: None, serve=False, one_tile=True).library
    return built


def special(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    flat = t.view(-1)
    at = torch.randint(0, flat.numel(), (max(1, flat.numel() // 97),), generator=g)
    flat[at] = SPECIAL[torch.randint(0, len(SPECIAL), at.shape, generator=g)].to(t.dtype)
    return t


def bits(lib, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    m, k, n = x.shape[0], x.shape[1], w.shape[0]
    y = torch.empty(m, n, dtype=torch.bfloat16)
    assert lib._lib.aotpack_linear_dpbf16(x.data_ptr(), BF16, m, k, w.data_ptr(), BF16, n, y.data_ptr()) == 0
    return torch.where(y.isnan(), torch.tensor(0x7FC0, dtype=torch.int16), y.view(torch.int16))


def main() -> None:
    libs, g = libraries(), torch.Generator().manual_seed(0)
    calls = differ = 0
    for n, k in SHAPES:
        w = torch.randn(n, k, generator=g).to(torch.bfloat16)
        if n < 100000:
            special(w, g)
        for m in (1, 2, 3, 8, 9, 17) if n < 100000 else (1, 8):
            x = special(torch.randn(m, k, generator=g).to(torch.bfloat16), g)
            outs = [bits(lib, x, w) for lib in libs.values()]
            calls += 1
            if not all(torch.equal(outs[0], o) for o in outs[1:]):
                differ += 1
                print("differ", n, k, m)
    print(calls, "calls,", differ, "differ")


if __name__ == "__main__":
    main()
