"""Weight-only quantization of a float model, in place, into runtime.quant's packed format.

Owns: choosing which modules are quantized: every linear layer of the text decoder, the `lm_head`,
and the token embedding (a tied pair stays tied, as one packed weight). Each scheme's own module packs
the weights (runtime.quant.int8, runtime.quant.int4). A VLM's vision tower and projector stay in
float: they run once per image, in the eager prefill, and never in the decode step.
"""

from __future__ import annotations

from torch import nn

from runtime.errors import ExportError
from runtime.format.manifest import Quantization
from runtime.quant import PackedWeight, QuantizedEmbedding, QuantizedLinear, QuantSpec


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
    shared = PackedWeight.of(spec, embedding.weight) if embed_path else None
    if embed_path:
        dtype = embedding.weight.dtype
        model.set_submodule(embed_path, QuantizedEmbedding(shared, dtype, getattr(embedding, "embed_scale", None)))
    for path, linear in linears.items():
        packed = shared if path == tied else PackedWeight.of(spec, linear.weight)
        bias = linear.bias.detach() if linear.bias is not None else None
        model.set_submodule(path, QuantizedLinear(packed, bias))
    return Quantization(spec.method, spec.group_size, tuple(linears), embed_path, tied)
