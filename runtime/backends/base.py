"""What a decode backend is: the protocol the engine steps through, and what every backend checks.

A backend's `open` returns a `Decode`: a callable that takes the step's inputs in the contract's order
(runtime.format.contract) with the KV cache, checks them (AOTInductor checks nothing: a wrong shape
corrupts the heap), writes the new keys and values into the cache, and returns next-token logits.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from runtime.cpu import check_kernels_isa
from runtime.errors import BundleError, IncompatibleBundleError


class Decode(Protocol):
    contract: object  # runtime.format.contract.DecodeContract
    batches: tuple[int, ...]  # the row counts it steps, ascending: a graph each, or every 1..batch_size
    verify_batches: tuple[int, ...]  # the row counts it verifies drafts for (k + 1 tokens a row); () for none
    chunk_tokens: int  # C: the prompt tokens of one row its `chunk` writes into the cache at once; 0: no chunk

    def __call__(self, input_ids, position_ids, cache_position, pad_mask, kv: list) -> object:
        """input_ids (b, 1), position_ids (b, 1), cache_position (b,), pad_mask (b, L), kv -> logits (b, vocab) fp32."""

    def bind(self, input_ids, position_ids, cache_position, kv: list) -> Callable[[object], object]:
        """The step over tensors the caller keeps and updates in place, as a call taking the pad mask alone
        (b, span) -> logits (b, vocab) fp32: what the engine steps through, checked once where a backend can."""

    def chunk(self, input_ids, position_ids, cache_position, pad_mask, kv: list) -> None:
        """Where chunk_tokens is C: input_ids (1, C) and position_ids (1, C) of one row's prompt tokens at
        cache indices [cache_position, + C), pad_mask (1, L), kv one row's -> their keys and values in kv."""


class Backend:
    """One way of running a bundle's decode step. Subclasses name the files they read and override
    the checks that apply to them."""

    name = ""

    def files(self, manifest) -> tuple[str, ...]:
        """The bundle files this backend reads to decode (besides the weights everyone reads)."""
        return ()

    def check_bundle(self, manifest, bundle: Path) -> None:
        """The bundle lists the files this backend reads; a BundleError naming the fix otherwise."""
        missing = [name for name in self.files(manifest) if name not in manifest.files]
        if missing:
            raise BundleError(f"{bundle} has no {missing[0]}, which the {self.name} backend decodes with; re-export it")

    def check_compatible(self, manifest) -> None:
        """This process can run the bundle's decode with this backend; IncompatibleBundleError otherwise.
        Every backend runs the eager prefill, which calls the bundle's integer kernels where it has them."""
        check_device(manifest.device)
        if manifest.native is not None:
            check_kernels_isa(manifest.native.isa)

    def open(self, bundle: Path, model, manifest, config) -> Decode:
        raise NotImplementedError


def checked_each_call(decode: Decode, input_ids, position_ids, cache_position, kv: list) -> Callable:
    """Decode.bind for a backend whose full checks cost little beside its step (eager, ONNX Runtime)."""
    return lambda pad_mask: decode(input_ids, position_ids, cache_position, pad_mask, kv)


def every_batch(contract) -> tuple[int, ...]:
    """The batches of a step with a dynamic batch: any of 1..batch_size."""
    return tuple(range(1, contract.batch_size + 1))


def check_device(device: str) -> None:
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise IncompatibleBundleError(
                "bundle was compiled for device 'cuda' but no CUDA device is available here; "
                "run it on a GPU machine or re-export with --device cpu"
            )
