"""Writing the model half of a bundle: weights, config, generation config, tokenizer or processor.

Owns: the writing side of runtime/model/weights.py's contract. Every persistent parameter and buffer is
stored under its module path; a tensor that several paths share (a tied lm_head) is stored once and
the other paths become `weight_aliases`. `save_pretrained` is not used for weights: it refuses
quantized modules, and for some models (the Gemma3 VLM) writes a legacy key layout.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from exporter.tokenizer import use_generic_class
from runtime.format.files import WEIGHTS


def _identity(t: torch.Tensor) -> tuple:
    return t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype


def split_aliases(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors by module path, each stored once; aliases: path -> the stored path of the same tensor)."""
    stored: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    first: dict[tuple, str] = {}
    for path, tensor in model.state_dict().items():
        key = _identity(tensor)
        if key in first:
            aliases[path] = first[key]
        else:
            first[key] = path
            stored[path] = tensor.detach().to("cpu").contiguous()
    return stored, aliases


def write_model(model: nn.Module, preprocessor, out: Path, generation=None) -> dict[str, str]:
    """Write weights, configs and the tokenizer/processor into `out`; returns the weight aliases.
    `generation`: the bundle's generation defaults (exporter.generation), else the model's own."""
    stored, aliases = split_aliases(model)
    save_file(stored, str(out / WEIGHTS), metadata={"format": "pt"})
    model.config.save_pretrained(out)
    generation = generation if generation is not None else model.generation_config
    if generation is not None:
        generation.save_pretrained(out)
    preprocessor.save_pretrained(out)
    use_generic_class(out)  # faster to load, where it provably behaves the same (exporter.tokenizer)
    return aliases
