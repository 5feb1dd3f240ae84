"""Quantization of a float model, in place, into runtime.quant's packed format.

Owns: choosing which modules are quantized (every linear layer of the text decoder, the `lm_head`, and
the token embedding; a tied pair stays tied, as one packed weight), the recipe that says at which method
each is held, and how int4 scales are chosen. Each scheme's own module packs the weights
(runtime.quant.int8, int4, int8_dot, int4_dot, int5_dot). A VLM's vision tower and projector stay in float: they run
once per image, in the eager prefill, and never in the decode step.

int4 recipes, each holding some modules at more bits (llama.cpp's choices in llama-quant.cpp,
`llama_tensor_get_type`, where Q4_K_M gives them 5 to 8 bits; aotpack has int5 (Q5_0) and int8, no 6-bit):
- `sensitive`: at int8, the output projection (and a tied embedding with it), and the attention value and
  MLP down projections of the layers `use_more_bits` picks (the first and last eighth, and every third
  between), where Q4_K_M gives Q6_K (or Q8_0, its fallback);
- `mixed` (the default): those, and every other weight whose input width is not a multiple of 256. Q4_K
  needs 256-column super-blocks, and Q4_K_M falls back to Q5_0 for such weights, so on models with such
  widths (Gemma 3 270M's 640, SmolLM2's 576) most of Q4_K_M is 5-bit. The integer family holds them at
  int5, as Q5_0 (runtime.quant.int5_dot: groups of 32 whatever --group-size says, as Q5_0's blocks);
  Inductor's family, which has no int5, at int8, as it does a width that is not whole blocks of 32;
- `uniform`: every module at int4.
The int4 modules get scales searched per group (exporter.scales); int5 takes Q5_0's grid, which keeps a
weight that is already on one (the PyPI Gemma 3 270M's Q5_0 tensors) exactly.
"""

from __future__ import annotations

import re

from torch import nn

from exporter import scales
from runtime.errors import ExportError
from runtime.format.manifest import Quantization
from runtime.format.quant import INT5, INT5_GROUP, INTEGER, LAYOUTS
from runtime.quant import INT4, INT8, PackedWeight, QuantizedEmbedding, QuantizedLinear, QuantSpec

SUPER_BLOCK = 256  # columns of llama.cpp's K-quant super-block: narrower rows fall back to more bits
SENSITIVE = ("v_proj", "down_proj")  # llama.cpp's attn_v and ffn_down
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def _linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The text decoder's linear layers and the lm_head, by module path."""
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    paths = {id(module): path for path, module in model.named_modules()}
    found = {f"{paths[id(decoder)]}.{p}": m for p, m in decoder.named_modules() if isinstance(m, nn.Linear)}
    return found | {paths[id(head)]: head}


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's `use_more_bits`: the layers whose sensitive tensors Q4_K_M keeps at 6 bits."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def held_paths(recipe: str, linears: dict[str, nn.Linear], embedding: str | None, head: str, layers: int):
    """The modules an int4 recipe holds at more bits: (those at 6 bits or more in Q4_K_M, those at 5)."""
    if recipe == "uniform":
        return (), ()
    six, five = [head, *([embedding] if embedding else [])], []
    for path, linear in linears.items():
        found = _LAYER.search(path)
        if found and path.rsplit(".", 1)[-1] in SENSITIVE and more_bits(int(found.group(1)), layers):
            six.append(path)
        elif recipe == "mixed" and linear.in_features % SUPER_BLOCK:
            five.append(path)
    six = tuple(dict.fromkeys(six))
    return six, tuple(p for p in dict.fromkeys(five) if p not in six)


def plan(model: nn.Module, spec: QuantSpec, recipe: str, scale_search: str) -> Quantization:
    """Which modules are quantized, and at which method: refuses what the spec cannot pack."""
    linears = _linears(model)
    embedding = model.get_input_embeddings()
    paths = {id(module): path for path, module in model.named_modules()}
    head = paths[id(model.get_output_embeddings())]
    layers = model.config.get_text_config().num_hidden_layers
    int4 = spec.method == INT4
    six, five = held_paths(recipe, linears, paths[id(embedding)], head, layers) if int4 else ((), ())
    # Inductor's family has no int5, nor does a width that is not whole blocks of 32: int8 there
    five_ok = tuple(p for p in five if spec.kernels == INTEGER and linears[p].in_features % INT5_GROUP == 0)
    kept, five = (*six, *(p for p in five if p not in five_ok)), five_ok
    bad = sorted(p for p, m in linears.items() if not _spec(spec, p, kept, five).accepts(m.in_features))
    if bad:
        raise ExportError(
            f"{bad[:3]} have input sizes that {spec.method} with group size {spec.group_size} cannot pack; "
            "choose another --group-size"
        )
    embed = paths[id(embedding)]
    embed_path = embed if _spec(spec, embed, kept, five).accepts(embedding.embedding_dim) else None
    tied = head if embed_path and linears[head].weight is embedding.weight else None
    return Quantization(
        method=spec.method,
        group_size=spec.group_size,
        kernels=spec.kernels,
        layout=LAYOUTS[spec.kernels],
        linears=tuple(linears),
        embedding=embed_path,
        tied=tied,
        recipe=recipe if int4 else "uniform",
        int8_paths=tuple(p for p in kept if p in linears or p == embed_path),
        int5_paths=tuple(p for p in five if p in linears or p == embed_path),
        scales=scale_search if spec.method == INT4 else "minmax",
        kernel_rates={},
        kernel_noise=None,
    )


def _spec(spec: QuantSpec, path: str, kept, five) -> QuantSpec:
    if path in five:
        return QuantSpec(INT5, INT5_GROUP, spec.kernels)
    return spec if path not in kept else QuantSpec(INT8, None, spec.kernels)


def quantize_model(model: nn.Module, q: Quantization) -> None:
    """Replace the planned linear layers, the lm_head and the token embedding by quantized modules."""
    linears = _linears(model)
    embedding = model.get_input_embeddings()
    shared = _packed(q, q.embedding, embedding.weight) if q.embedding else None
    if q.embedding:
        scale = getattr(embedding, "embed_scale", None)
        model.set_submodule(q.embedding, QuantizedEmbedding(shared, embedding.weight.dtype, scale))
    for path in q.linears:
        linear = linears[path]
        packed = shared if path == q.tied else _packed(q, path, linear.weight)
        bias = linear.bias.detach() if linear.bias is not None else None
        model.set_submodule(path, QuantizedLinear(packed, bias))


def _packed(q: Quantization, path: str, weight) -> PackedWeight:
    spec = q.spec(path)
    grid = scales.search(spec, weight) if spec.method == INT4 and q.scales == "mse" else None
    return PackedWeight.of(spec, weight, grid)
