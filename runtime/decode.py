"""The compiled single-token decode step, loaded from the bundle's `.pt2`.

Owns: loading the AOTInductor package, checking it was compiled for the manifest's signature, lending
it the eager model's weight tensors (no second copy), and calling it. AOTInductor validates nothing, so
every call is checked against the bundle's DecodeContract (runtime.contract) before the native call.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from runtime import compat
from runtime.contract import DecodeContract
from runtime.errors import BundleError, IntegrityError
from runtime.manifest import Manifest


def lend_constants(model: nn.Module, constants, device: str) -> dict[str, torch.Tensor]:
    """Map each compiled constant to the eager model's own tensor, refusing any that differs in
    dtype, shape or device from what the decode was compiled for (it would misread it)."""
    tensors = {}
    for const in constants:
        tensor = _eager_tensor(model, const)
        expected = (getattr(torch, const.dtype), tuple(const.shape), device)
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
    """The compiled step, called through the bundle's DecodeContract:
    input_ids (b, 1), position_ids (b, 1), cache_position (1,), pad_mask (b, L), kv -> logits (b, vocab)."""

    def __init__(self, package: Path, model: nn.Module, manifest: Manifest, sha256: str | None = None):
        """`sha256`: what the package's bytes must hash to (the manifest's entry); the loaded code is then
        exactly the verified bytes, even if the bundle's file is replaced meanwhile."""
        self.manifest = manifest
        self.contract = DecodeContract.of(manifest)
        constants = lend_constants(model, manifest.constants, manifest.device)
        with _private_copy(Path(package), sha256) as private:
            try:
                self._loader = compat.load_aoti_package(str(private))
            except RuntimeError as e:  # a damaged package whose hash was recomputed, a missing symbol
                raise BundleError(
                    f"{Path(package).name} could not be loaded ({str(e)[:300]}); re-export the bundle"
                ) from None
        self.contract.check_package(self._loader.get_metadata())  # before any native call
        expected = set(self._loader.get_constant_fqns())
        if expected != set(constants):
            raise BundleError(
                f"compiled decode expects constants {sorted(expected - set(constants))[:5]} the manifest does "
                "not provide; the bundle is inconsistent, re-export it"
            )
        compat.lend_constants(self._loader, constants)  # user-managed: one copy of every weight
        self._run = self._loader.run  # flat inputs: no per-step pytree flattening

    def __call__(self, input_ids, position_ids, cache_position, pad_mask, kv: list[torch.Tensor]) -> torch.Tensor:
        inputs = [input_ids, position_ids, cache_position, pad_mask, *kv]
        self.contract.check(inputs)
        return self._run(inputs)[0]


def verified_bytes(path: Path, sha256: str | None) -> bytes:
    """The file's bytes, checked against `sha256` (the manifest's entry): what is then loaded is exactly
    what was verified, even if the bundle's file is replaced meanwhile."""
    data = path.read_bytes()
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise IntegrityError(f"{path.name} changed after it was verified; re-verify or re-export the bundle")
    return data


@contextmanager
def _private_copy(package: Path, sha256: str | None):
    """The package's bytes, checked against `sha256`, in a fresh private directory that is also where
    the AOTInductor loader unpacks the `.so` (it follows TMPDIR). Checking the file and then loading the
    same path would let a swap in between run unchecked code; and a failed load used to leave its
    unpacked `/tmp/aotinductor_*` behind. The directory goes once the loader has mapped the `.so`."""
    private = Path(tempfile.mkdtemp(prefix="aotpack-decode-"))
    previous = os.environ.get("TMPDIR")
    try:
        data = verified_bytes(package, sha256)
        copy = private / package.name
        copy.write_bytes(data)
        os.environ["TMPDIR"] = str(private)
        yield copy
    finally:
        if previous is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = previous
        shutil.rmtree(private, ignore_errors=True)
