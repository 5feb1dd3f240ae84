"""Weight-only quantization of a float model, in place, into runtime.quant's packed format.

Owns: computing the integers and scales from float weights (int8: symmetric, one scale per row;
int4: asymmetric min/max per group of columns), and choosing which modules are quantized: every
linear layer of the text decoder, the `lm_head`, and the token embedding (a tied pair stays tied, as
one packed weight). A VLM's vision tower and projector stay in float: they run once per image, in
the eager prefill, and never in the decode step.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.errors import ExportError
from runtime.manifest import Quantization
from runtime.quant import INT8, PackedWeight, QuantizedEmbedding, QuantizedLinear, QuantSpec

_TINY = torch.finfo(torch.float32).tiny  # keeps an all-zero row's scale finite


def _words(q: torch.Tensor) -> torch.Tensor:
    """(rows, count, fields) small integers laid out as runtime.quant expects -> float32-typed words."""
    bits = 32 // q.shape[-1]
    shifts = torch.arange(q.shape[-1], dtype=torch.int64) * bits
    words = ((q.long() & ((1 << bits) - 1)) << shifts).sum(-1)  # (rows, count), 0 <= w < 2**32
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).view(torch.float32)


def pack(spec: QuantSpec, weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A float (rows, cols) weight -> (words, scales[, mins]) in runtime.quant's layout."""
    w = weight.detach().float().cpu()
    rows, cols = w.shape
    if spec.method == INT8:
        scales = w.abs().amax(1).clamp(min=_TINY) / 127  # (rows,)
        q = torch.round(w / scales[:, None]).clamp(-127, 127)  # (rows, cols)
        return _words(q.view(rows, 4, cols // 4).transpose(1, 2)), scales  # byte j of word c <- column j*cols/4 + c
    grouped = w.view(rows, cols // spec.group_size, spec.group_size)  # (rows, groups, gs)
    low, high = grouped.amin(-1), grouped.amax(-1)
    # Round scale and min to their stored dtype first, so the integers fit what is actually stored.
    scales = ((high - low) / 15).clamp(min=_TINY).to(torch.bfloat16)
    mins = low.to(torch.bfloat16)
    q = torch.round((grouped - mins.float()[..., None]) / scales.float()[..., None]).clamp(0, 15)
    return _words(q.view(rows, cols // 8, 8)), scales, mins  # nibble j of word c <- column 8c + j


def packed_weight(spec: QuantSpec, weight: torch.Tensor) -> PackedWeight:
    module = PackedWeight(spec, *weight.shape)
    for buffer, value in zip(module.tensors(), pack(spec, weight), strict=True):
        buffer.copy_(value)
    return module.to(weight.device)


def _linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The text decoder's linear layers and the lm_head, by module path."""
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    paths = {id(module): path for path, module in model.named_modules()}
    found = {f"{paths[id(decoder)]}.{p}": m for p, m in decoder.named_modules() if isinstance(m, nn.Linear)}
    return found | {paths[id(head)]: head}


def quantize_model(model: nn.Module, spec: QuantSpec) -> Quantization:
    """Replace the decoder's linear layers, the lm_head and the token embedding by quantized modules."""
    linears = _linears(model)
    bad = sorted(p for p, m in linears.items() if not spec.accepts(m.in_features))
    if bad:
        raise ExportError(
            f"{bad[:3]} have input sizes that {spec.method} with group size {spec.group_size} cannot pack; "
            "choose another --group-size"
        )
    embedding = model.get_input_embeddings()
    paths = {id(module): path for path, module in model.named_modules()}
    embed_path = paths[id(embedding)] if spec.accepts(embedding.embedding_dim) else None
    head_path = paths[id(model.get_output_embeddings())]
    tied = head_path if embed_path and linears[head_path].weight is embedding.weight else None
    shared = packed_weight(spec, embedding.weight) if embed_path else None
    if embed_path:
        dtype = embedding.weight.dtype
        model.set_submodule(embed_path, QuantizedEmbedding(shared, dtype, getattr(embedding, "embed_scale", None)))
    for path, linear in linears.items():
        packed = shared if path == tied else packed_weight(spec, linear.weight)
        bias = linear.bias.detach() if linear.bias is not None else None
        model.set_submodule(path, QuantizedLinear(packed, bias))
    return Quantization(spec.method, spec.group_size, tuple(linears), embed_path, tied)
