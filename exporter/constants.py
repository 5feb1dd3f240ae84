"""Which eager tensor backs each compiled-decode constant.

Owns: the map written to the manifest, from AOTInductor's constant names to the eager model's
parameter/buffer paths and the safetensors keys. Module paths are matched by tensor identity, so tied
weights (one tensor under several names) resolve to one tensor. Stored keys are matched by content,
because `save_pretrained` may write a checkpoint layout other than the module tree (transformers 5
saves a Gemma3 VLM's `model.language_model.*` as `language_model.model.*`).
"""

from __future__ import annotations

import torch
from safetensors import safe_open
from torch import nn

from runtime.errors import ExportError
from runtime.manifest import Constant


def _by_identity(module: nn.Module) -> dict[int, list[str]]:
    paths: dict[int, list[str]] = {}
    named = list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False))
    for path, tensor in named:
        paths.setdefault(id(tensor), []).append(path)
    return paths


def _suffix_overlap(a: str, b: str) -> int:
    n = 0
    for x, y in zip(reversed(a.split(".")), reversed(b.split("."))):
        if x != y:
            break
        n += 1
    return n


class StoredTensors:
    """The bundle's safetensors, read lazily: only tensors of a matching shape are ever loaded."""

    def __init__(self, files):
        self._handles = [safe_open(str(f), "pt") for f in files]
        self._where = {key: h for h in self._handles for key in h.keys()}
        self._shapes = {key: tuple(h.get_slice(key).get_shape()) for key, h in self._where.items()}

    def matching(self, path: str, tensor: torch.Tensor) -> str | None:
        """The key holding `tensor`'s values; among equal tensors (e.g. fresh norm weights), the key
        whose dotted name shares the longest suffix with `path`."""
        same_shape = [k for k, shape in self._shapes.items() if shape == tuple(tensor.shape)]
        same_shape.sort(key=lambda k: -_suffix_overlap(k, path))  # best name first: usually one load
        for key in same_shape:
            stored = self._where[key].get_tensor(key)
            if stored.dtype == tensor.dtype and torch.equal(stored, tensor):
                return key
        return None


def constant_sources(step: nn.Module, model: nn.Module, names, stored: StoredTensors) -> tuple[Constant, ...]:
    step_tensors = dict(step.named_parameters(remove_duplicate=False)) | dict(step.named_buffers(remove_duplicate=False))
    model_paths = _by_identity(model)
    constants = []
    for name in sorted(names):
        tensor = step_tensors.get(name)
        paths = model_paths.get(id(tensor), []) if tensor is not None else []
        if not paths:
            raise ExportError(f"compiled constant {name!r} is not a parameter or buffer of {type(model).__name__}")
        key = stored.matching(paths[0], tensor.detach().cpu())
        dtype = str(tensor.dtype).removeprefix("torch.")
        constants.append(Constant(name, paths[0], key, dtype, tuple(tensor.shape)))
    return tuple(constants)
