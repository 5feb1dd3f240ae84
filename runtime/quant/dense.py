"""Float weights through aotpack's own small-batch GEMMs: the `dense`, `tiles` and `dpbf16` lowerings of a
decode graph's linears.

Owns the op `aotpack::dense_linear(x, w)` (x (..., K) @ w (N, K).T, fp32 sums, output in x's dtype) and
the C shim the compiled decode calls for it (`aoti_torch_cpu_dense_linear`, in the bundle's kernels.so,
exporter/csrc/dense.cpp). It reads the checkpoint's own fp32, bf16 or fp16 weight, the tensor the eager
prefill reads through torch: no second copy. A decode graph uses it for a weight shape where the export's
timing chose it (exporter.lowering): it reuses each loaded (and converted) weight vector across 2
activation rows and each weight tile across all of them, where Inductor's fused reductions spilled
registers at 8 rows and ATen's mm ran a GEMV per row.

`aotpack::tiles_linear(x, w)` is the same product for bf16 activations and a bf16 weight on AMX tiles
(C shim `aoti_torch_cpu_tiles_linear`): the weight as stored again, up to 16 activation rows a tile
instruction, so a graph of 8 rows costs about what one costs. Only a kernels.so built for the `amx`
path has it, and only in a process Linux grants the tiles to (runtime.quant.native.Library.tiles).

`aotpack::dpbf16_linear(x, w)` is that product with AVX512-BF16's `vdpbf16ps` (C shim
`aoti_torch_cpu_dpbf16_linear`): 32 bf16 products an instruction from the weight as stored, where the
dense GEMM converts each weight to fp32 for 8 (16 with two rows a vector). For CPUs with AVX512-BF16 and
no AMX (AMD Zen 4 and 5); a kernels.so built with it has it (runtime.quant.native.Library.dpbf16).

The eager ops exist for the export's timing and tests; the runtime's prefill never calls them.
"""

from __future__ import annotations

import torch

from runtime.quant import native
from runtime.quant.scheme import product_like


def _shim(name: str) -> str:
    return f"AOTITorchError aoti_torch_cpu_{name}(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* ret0)"


def _float_op(name: str, kernel: str):
    """The op aotpack::`name`(x, w) -> x @ w.T through runtime.quant.native's `kernel`, and its fake."""

    @torch.library.custom_op(f"aotpack::{name}", mutates_args=())
    def op(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return getattr(native, kernel)(x, w)

    op.register_fake(product_like)
    return getattr(torch.ops.aotpack, name).default


OP, SHIM = _float_op("dense_linear", "linear_dense"), _shim("dense_linear")
TILES_OP, TILES_SHIM = _float_op("tiles_linear", "linear_tiles"), _shim("tiles_linear")
DPBF16_OP, DPBF16_SHIM = _float_op("dpbf16_linear", "linear_dpbf16"), _shim("dpbf16_linear")
