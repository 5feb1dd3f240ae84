"""The decode step's attention through aotpack's own kernel: the `native` candidate of exporter.attention.

Owns the op `aotpack::decode_attention(q, k, v, mask, scale)` (q (B, KV, R, D): each key/value head's R
query rows, a verify or chunk step's T tokens a row within them; k and v (B, KV, S, D) views of the cache;
mask (B or 1, 1, T, S) bool) and the C shim the compiled decode calls for it
(`aoti_torch_cpu_decode_attention`, in the bundle's kernels.so, exporter/csrc/attention.cpp). The kernel
reads each cached key and value once for all of a head's query rows, and splits the keys across threads
when there are fewer (row, head) pairs than threads.

The eager op exists for the export's timing and tests; the runtime's prefill never calls it.
"""

from __future__ import annotations

import torch

from runtime.quant import native

SHIM = (
    "AOTITorchError aoti_torch_cpu_decode_attention(AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle v, "
    "AtenTensorHandle mask, double scale, AtenTensorHandle* ret0)"
)


@torch.library.custom_op("aotpack::decode_attention", mutates_args=())
def decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    return native.decode_attention(q, k, v, mask, scale)


@decode_attention.register_fake
def _(q, k, v, mask, scale):
    # the shim's checks at trace time: operands it would refuse fail the export, not the bundle's first step
    native.check_attention_operands(q, k, v, mask, devices=("cpu", "meta"))
    return q.new_empty(q.shape)


OP = torch.ops.aotpack.decode_attention.default
