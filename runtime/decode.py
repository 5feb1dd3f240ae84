"""The compiled single-token decode step, loaded from the bundle's `.pt2`.

Owns: loading the AOTInductor package, lending it the eager model's weight tensors (no second copy),
and calling it. AOTInductor validates nothing, so `CompiledDecode.__call__` checks shapes, dtypes,
devices and contiguity of every input before the native call.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from runtime.errors import BundleError, InvalidInputError
from runtime.manifest import Manifest


def lend_constants(model: nn.Module, manifest: Manifest) -> dict[str, torch.Tensor]:
    """Map each compiled constant to the eager model's own tensor, refusing any that differs in
    dtype, shape or device from what the .so was compiled for (the .so would misread it)."""
    tensors = {}
    for const in manifest.constants:
        tensor = _eager_tensor(model, const)
        expected = (getattr(torch, const.dtype), tuple(const.shape), manifest.device)
        found = (tensor.dtype, tuple(tensor.shape), tensor.device.type)
        if found != expected:
            raise BundleError(
                f"weight {const.module_path!r} is {found}, the compiled decode needs {expected}; "
                "the bundle's config or weights do not match its decode, re-export it"
            )
        tensors[const.name] = tensor.data
    return tensors


def _eager_tensor(model: nn.Module, const) -> torch.Tensor:
    for getter in (model.get_parameter, model.get_buffer):
        try:
            return getter(const.module_path)
        except AttributeError:
            continue
    raise BundleError(
        f"compiled constant {const.name!r} expects eager tensor {const.module_path!r}, which "
        f"{type(model).__name__} does not have; the bundle does not match its config, re-export it"
    )


class CompiledDecode:
    """input_ids (b, 1), position_ids (b, 1), cache_position (1,), pad_mask (b, L), kv -> logits (b, vocab)."""

    def __init__(self, package: Path, model: nn.Module, manifest: Manifest):
        self.manifest = manifest
        constants = lend_constants(model, manifest)
        # The C++ loader itself: `torch._inductor.aoti_load_package` wraps the same object but imports
        # torch._inductor and torch._dynamo first, about 3 s of start-up that loading never needs.
        self._loader = torch._C._aoti.AOTIModelPackageLoader(str(package), "model", False, 1, -1)
        expected = set(self._loader.get_constant_fqns())
        if expected != set(constants):
            raise BundleError(
                f"compiled decode expects constants {sorted(expected - set(constants))[:5]} the manifest does "
                "not provide; the bundle is inconsistent, re-export it"
            )
        # (constants, use_inactive, check_full_update, user_managed, allow_h2d_copy). user_managed: the
        # .so keeps our tensor handles, so eager prefill and decode share one copy of every weight.
        self._loader.load_constants(constants, False, True, True, False)
        self._run = self._loader.run  # flat inputs: no per-step pytree flattening
        self.device = torch.device(manifest.device)

    def __call__(self, input_ids, position_ids, cache_position, pad_mask, kv: list[torch.Tensor]) -> torch.Tensor:
        self._check_inputs(input_ids, position_ids, cache_position, pad_mask, kv)
        return self._run([input_ids, position_ids, cache_position, pad_mask, *kv])[0]

    def _check_inputs(self, input_ids, position_ids, cache_position, pad_mask, kv) -> None:
        m = self.manifest
        batch = input_ids.shape[0]
        if not 1 <= batch <= m.batch_size:
            raise InvalidInputError(f"batch {batch} is outside this bundle's 1..{m.batch_size}; re-export with --batch-size {batch}")
        _expect("input_ids", input_ids, (batch, 1), torch.long, self.device)
        _expect("position_ids", position_ids, (batch, 1), torch.long, self.device)
        _expect("cache_position", cache_position, (1,), torch.long, self.device)
        _expect("pad_mask", pad_mask, (batch, m.max_cache_len), torch.bool, self.device)
        if not 0 <= int(cache_position) < m.max_cache_len:
            raise InvalidInputError(f"cache_position {int(cache_position)} is outside the cache's 0..{m.max_cache_len - 1}")
        dtype = getattr(torch, m.dtype)
        for i, layer in enumerate(m.cache_layout):
            for j, name in enumerate(("keys", "values")):
                shape = (batch, layer.num_kv_heads, layer.slots, layer.head_dim)
                _expect(f"layer {i} {name}", kv[2 * i + j], shape, dtype, self.device)


def _expect(name: str, t: torch.Tensor, shape, dtype, device) -> None:
    if not isinstance(t, torch.Tensor):
        raise InvalidInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise InvalidInputError(f"{name} has shape {tuple(t.shape)}, the compiled decode needs {tuple(shape)}")
    if t.dtype != dtype:
        raise InvalidInputError(f"{name} has dtype {t.dtype}, the compiled decode needs {dtype}")
    if t.device.type != device.type:
        raise InvalidInputError(f"{name} is on {t.device}, the compiled decode runs on {device}")
    if not t.is_contiguous():
        raise InvalidInputError(f"{name} is not contiguous; call .contiguous() first")
