"""Which eager tensor backs each compiled-decode constant.

Owns: the map written to the manifest, from AOTInductor's constant names to the eager model's
parameter/buffer paths and their keys in the bundle's weights file. Module paths are matched by tensor
identity, so tied weights (one tensor under several names) resolve to one tensor, and non-persistent
buffers (rotary `inv_freq`) get no key: the runtime rebuilds them from the config.
"""

from __future__ import annotations

from torch import nn

from runtime.errors import ExportError
from runtime.format.manifest import Constant


def _by_identity(module: nn.Module) -> dict[int, list[str]]:
    paths: dict[int, list[str]] = {}
    named = list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False))
    for path, tensor in named:
        paths.setdefault(id(tensor), []).append(path)
    return paths


def constant_sources(step: nn.Module, model: nn.Module, names, aliases: dict[str, str]) -> tuple[Constant, ...]:
    step_tensors = dict(step.named_parameters(remove_duplicate=False)) | dict(
        step.named_buffers(remove_duplicate=False)
    )
    model_paths = _by_identity(model)
    persistent = set(model.state_dict())
    constants = []
    for name in sorted(names):
        tensor = step_tensors.get(name)
        paths = model_paths.get(id(tensor), []) if tensor is not None else []
        if not paths:
            raise ExportError(f"compiled constant {name!r} is not a parameter or buffer of {type(model).__name__}")
        key = aliases.get(paths[0], paths[0]) if paths[0] in persistent else None
        dtype = str(tensor.dtype).removeprefix("torch.")
        constants.append(Constant(name, paths[0], key, dtype, tuple(tensor.shape)))
    return tuple(constants)
