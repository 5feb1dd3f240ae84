"""Building the eager model from a bundle: its config, its one safetensors file, its quantized layers.

Owns: the weight-file contract. `model.safetensors` maps each persistent parameter or buffer's module
path to its tensor; a tensor shared by several paths (a tied `lm_head`) is stored once, under the path
the manifest's `weight_aliases` points the others at. The model is built from its config with weight
initialisation off, the bundle's integer kernels (if any) are loaded for the quantized layers' eager
op, quantized layers are put in place as empty shells, and every stored tensor is then
assigned (not copied) into the module tree. So no float copy of a quantized weight is ever made, and
nothing is initialised only to be overwritten.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file
from torch import nn

from runtime import compat
from runtime.errors import BundleError
from runtime.format.files import WEIGHTS
from runtime.format.manifest import DPBF16, TILES, Manifest, Quantization, chosen_lowerings
from runtime.quant import PackedWeight, QuantizedEmbedding, QuantizedLinear, native


def model_class(name: str):
    cls = getattr(transformers, name, None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise BundleError(
            f"bundle model class {name!r} is not a transformers model class in transformers {transformers.__version__}"
        )
    return cls


def build_model(bundle: Path, manifest: Manifest) -> nn.Module:
    """The eager model of a verified bundle, on the manifest's device, in eval mode."""
    config = transformers.AutoConfig.from_pretrained(bundle, local_files_only=True)
    dtype = getattr(torch, manifest.dtype)
    model = compat.empty_model(model_class(manifest.model_class), config, dtype, manifest.attn_implementation)
    if manifest.native is not None:  # the integer kernels: the eager op and the decode graphs call them
        chosen = chosen_lowerings(manifest)
        native.load(bundle / manifest.native.file, manifest.native.isa, tiles=TILES in chosen, dpbf16=DPBF16 in chosen)
    if manifest.quantization is not None:
        install_quantized(model, manifest.quantization, dtype)
    load_weights(model, read_weights(bundle / WEIGHTS), manifest.weight_aliases)
    return model.to(manifest.device).eval()


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors as the runtime holds them: views of one private mapping of the file,
    its pages the page cache's (copied only if written). The exporter times kernels on weights held so
    (exporter.timing.held_as_loaded): where the pages come from changes which kernel streams them fastest."""
    return load_file(str(path))


def load_weights(model: nn.Module, stored: dict[str, torch.Tensor], aliases: dict[str, str]) -> None:
    """Assign every stored tensor into the model; alias paths get their target's tensor (shared storage)."""
    state = dict(stored) | {alias: stored[target] for alias, target in aliases.items() if target in stored}
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise BundleError(
            f"{WEIGHTS} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}; "
            "re-export the bundle"
        )
    model.load_state_dict(state, strict=True, assign=True)


def install_quantized(model: nn.Module, q: Quantization, dtype: torch.dtype) -> None:
    """Replace the recorded linear layers and embedding with empty quantized shells of the same shape.
    A tied lm_head shares the embedding's PackedWeight module, so both read one set of tensors."""
    shared = None
    if q.embedding is not None:
        old = model.get_submodule(q.embedding)
        shared = PackedWeight(q.spec(q.embedding), old.num_embeddings, old.embedding_dim)
        model.set_submodule(q.embedding, QuantizedEmbedding(shared, dtype, getattr(old, "embed_scale", None)))
    for path in q.linears:
        old = model.get_submodule(path)
        packed = shared if path == q.tied else PackedWeight(q.spec(path), old.out_features, old.in_features)
        bias = torch.empty_like(old.bias) if old.bias is not None else None
        model.set_submodule(path, QuantizedLinear(packed, bias))
