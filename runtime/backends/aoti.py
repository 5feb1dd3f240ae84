"""The `aoti` backend: the compiled single-token decode step, loaded from the bundle's `.pt2`.

Owns: whether this process can run the `.so` (the torch build it was compiled with, the device, the
CPU ISA), loading each batch bucket's graph from a private copy of the package's verified bytes,
checking each was compiled for the manifest's signature at its batch, lending every graph the same
eager weight tensors (one copy of the weights, however many graphs), and calling the graph whose batch
the inputs have. AOTInductor validates nothing and only warns on a mismatched ISA, so every check here
runs before native code does, and every call is checked against the contract (runtime.backends.checks):
a bound step (`bind`, what the engine steps through) its held tensors once, its pad mask and cache
positions each call.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from runtime import compat
from runtime.backends.base import Backend
from runtime.backends.checks import (
    CACHE_POSITION,
    PAD_MASK,
    check_held_inputs,
    check_span_inputs,
    check_step_inputs,
    lend_constants,
)
from runtime.cpu import check_cpu_isa
from runtime.errors import BundleError, IncompatibleBundleError, InvalidInputError
from runtime.format.contract import DecodeContract, graph_name, graph_title
from runtime.format.files import DECODE, read_verified
from runtime.format.manifest import Manifest


class CompiledDecode:
    """The compiled step, called through the bundle's DecodeContract:
    input_ids (b, 1), position_ids (b, 1), cache_position (b,), pad_mask (b, L), kv -> logits (b, vocab),
    where b is one of `batches` (a graph each); with k + 1 tokens a row (a verify step, b one of
    `verify_batches`), logits (b, k + 1, vocab). `chunk`: the chunk graph, where the bundle has one."""

    def __init__(self, package: Path, model: nn.Module, manifest: Manifest, sha256: str | None = None):
        """`sha256`: what the package's bytes must hash to (the manifest's entry); the loaded code is then
        exactly the verified bytes, even if the bundle's file is replaced meanwhile."""
        self.contract = DecodeContract.of(manifest)
        self.batches, self.verify_batches = manifest.batches, manifest.verify_batches
        self.chunk_tokens = manifest.chunk_tokens
        constants = lend_constants(model, manifest.constants, manifest.device)
        verify, name, c = self.contract.verify_tokens, Path(package).name, self.chunk_tokens
        with _private_copy(Path(package), sha256) as private:
            loaders = {b: self._open_graph(private, name, (b, 1, False), constants) for b in self.batches}
            verifiers = {b: self._open_graph(private, name, (b, verify, False), constants) for b in self.verify_batches}
            chunker = self._open_graph(private, name, (1, c, True), constants) if c else None
        self._loaders = loaders | {(b, verify): loader for b, loader in verifiers.items()} | {"chunk": chunker}
        self._runs = {b: loader.run for b, loader in loaders.items()}  # flat inputs: no pytree per step
        self._verifies = {b: loader.run for b, loader in verifiers.items()}
        self._chunk = chunker.run if chunker else None

    def _open_graph(self, private: Path, name: str, shape: tuple[int, int, bool], constants: dict):
        """The graph of `shape` (batch, tokens, chunk), checked and lent its constants: every one of a
        decode or verify graph's; the chunk graph, which has no lm_head, those it names (all of them
        where the lm_head is the tied embedding)."""
        batch, tokens, chunk = shape
        what = f"the {graph_title(*shape)}"
        try:
            loader = compat.load_aoti_package(str(private), graph_name(*shape))
        except RuntimeError as e:  # a damaged package whose hash was recomputed, a missing graph or symbol
            raise BundleError(f"{name} could not be loaded for {what} ({str(e)[:300]}); re-export the bundle") from None
        self.contract.check_package(loader.get_metadata(), name, *shape)  # before any native call
        expected = set(loader.get_constant_fqns())
        if not expected <= set(constants) or (expected != set(constants) and not chunk):
            differ = sorted(expected ^ set(constants))[:5]
            raise BundleError(
                f"compiled decode ({what}) and the manifest's constants differ ({differ}); the bundle is "
                "inconsistent, re-export it"
            )
        compat.lend_constants(loader, {k: v for k, v in constants.items() if k in expected})  # one copy for all
        return loader

    def __call__(self, input_ids, position_ids, cache_position, pad_mask, kv: list[torch.Tensor]) -> torch.Tensor:
        inputs = [input_ids, position_ids, cache_position, pad_mask, *kv]
        tokens = check_step_inputs(self.contract, inputs, self.batches, self.verify_batches)
        return (self._runs if tokens == 1 else self._verifies)[input_ids.shape[0]](inputs)[0]

    def bind(self, input_ids, position_ids, cache_position, kv: list[torch.Tensor]) -> Callable:
        """The decode step over these tensors, which the caller keeps and updates in place (the engine's
        rows): checked here once, and held as views only this step has, whose shapes nobody else can
        change. Each call takes the pad mask (b, span) and checks it and the cache positions' values
        only: the 64 inputs of a 30-layer step, checked each call and sliced each step, cost ~0.15 ms
        of a 5 ms SmolLM2-135M int8 step (AMD EPYC Zen 4, 2 threads)."""
        inputs = [input_ids, position_ids, cache_position, None, *kv]
        if check_held_inputs(self.contract, inputs, self.batches, self.verify_batches) != 1:
            raise InvalidInputError("a bound step takes one token a row; call the decode itself for a verify step")
        head, kv = [t.view(t.shape) for t in inputs[:PAD_MASK]], [t.view(t.shape) for t in kv]
        batch, contract, positions = input_ids.shape[0], self.contract, head[CACHE_POSITION]

        def step(pad_mask: torch.Tensor) -> torch.Tensor:
            check_span_inputs(contract, pad_mask, positions, 1)
            return self._runs[batch]([*head, pad_mask, *kv])[0]

        return step

    def chunk(self, input_ids, position_ids, cache_position, pad_mask, kv: list[torch.Tensor]) -> None:
        if self._chunk is None:
            raise InvalidInputError("this bundle has no chunk graph; export it with --chunk-graph C")
        inputs = [input_ids, position_ids, cache_position, pad_mask, *kv]
        check_step_inputs(self.contract, inputs, chunk=True)
        self._chunk(inputs)


@contextmanager
def _private_copy(package: Path, sha256: str | None):
    """The package's bytes, checked against `sha256`, in a fresh private directory that is also where
    the AOTInductor loader unpacks the `.so` (it follows TMPDIR). Checking the file and then loading the
    same path would let a swap in between run unchecked code; and a failed load used to leave its
    unpacked `/tmp/aotinductor_*` behind. The directory goes once the loader has mapped the `.so`."""
    private = Path(tempfile.mkdtemp(prefix="aotpack-decode-"))
    previous = os.environ.get("TMPDIR")
    try:
        data = read_verified(package, sha256)
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


class AotiBackend(Backend):
    name = "aoti"

    def files(self, manifest) -> tuple[str, ...]:
        return (DECODE,)

    def check_compatible(self, manifest) -> None:
        """The `.so` is tied to the torch build it was compiled with, its device and its CPU ISA."""
        if manifest.torch_version != torch.__version__:
            raise IncompatibleBundleError(
                f"bundle was compiled with torch {manifest.torch_version}, this process has torch {torch.__version__}; "
                f"install torch=={manifest.torch_version} or re-export the bundle with this torch"
            )
        super().check_compatible(manifest)
        if manifest.device == "cpu":
            check_cpu_isa(manifest.cpu_isa)

    def open(self, bundle: Path, model, manifest, config) -> CompiledDecode:
        return CompiledDecode(bundle / DECODE, model, manifest, sha256=manifest.files[DECODE])


BACKEND = AotiBackend()
