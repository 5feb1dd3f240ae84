"""Float weights through aotpack's own small-batch GEMM: the `dense` lowering of a decode graph's linears.

Owns the op `aotpack::dense_linear(x, w)` (x (..., K) @ w (N, K).T, fp32 sums, output in x's dtype) and
the C shim the compiled decode calls for it (`aoti_torch_cpu_dense_linear`, in the bundle's kernels.so,
exporter/csrc/dense.cpp). It reads the checkpoint's own fp32, bf16 or fp16 weight, the tensor the eager
prefill reads through torch: no second copy. A decode graph uses it for a weight shape where the export's
timing chose it (exporter.lowering): it reuses each loaded (and converted) weight vector across 2
activation rows and each weight tile across all of them, where Inductor's fused reductions spilled
registers at 8 rows and ATen's mm ran a GEMV per row.

The eager op exists for the export's timing and tests; the runtime's prefill never calls it.
"""

from __future__ import annotations

import torch

from runtime.quant import native

SHIM = "AOTITorchError aoti_torch_cpu_dense_linear(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* ret0)"


@torch.library.custom_op("aotpack::dense_linear", mutates_args=())
def dense_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return native.linear_dense(x, w)


@dense_linear.register_fake
def _(x, w):
    return x.new_empty(*x.shape[:-1], w.shape[0])


OP = torch.ops.aotpack.dense_linear.default
