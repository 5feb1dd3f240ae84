"""The `eager` backend: the decode step run by torch as it is, with no compiled code.

Owns: calling runtime.model.step's DecodeStep, the very module the exporter traces, over the eager
model, through the same contract checks as the compiled step. It needs nothing of the bundle but its
weights and config, and runs wherever the eager model does: a debugging fallback (is a difference the
`.so`'s or the engine's?), and how the engine is tested in seconds without compiling anything. It is
as slow as HF's eager decode.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from runtime.backends.base import Backend, checked_each_call, every_batch
from runtime.backends.checks import check_step_inputs
from runtime.format.contract import DecodeContract
from runtime.model.step import decode_step


class EagerDecode:
    """input_ids (b, 1), position_ids (b, 1), cache_position (b,), pad_mask (b, L), kv -> logits (b, vocab);
    with the contract's k + 1 tokens a row (a verify step), logits (b, k + 1, vocab). `chunk`: the chunk
    graph's computation, run as it is."""

    def __init__(self, model: nn.Module, contract: DecodeContract):
        self.contract = contract
        self.batches = every_batch(contract)
        self.verify_batches = self.batches if contract.draft_tokens else ()
        self.chunk_tokens = contract.chunk_tokens
        self.step = decode_step(model, contract.layout)
        self.chunk_step = self.step.without_head()

    @torch.inference_mode()
    def __call__(self, input_ids, position_ids, cache_position, pad_mask, kv: list[torch.Tensor]) -> torch.Tensor:
        inputs = [input_ids, position_ids, cache_position, pad_mask, *kv]
        check_step_inputs(self.contract, inputs)
        return self.step(*inputs)

    def bind(self, input_ids, position_ids, cache_position, kv: list[torch.Tensor]):
        return checked_each_call(self, input_ids, position_ids, cache_position, kv)

    @torch.inference_mode()
    def chunk(self, input_ids, position_ids, cache_position, pad_mask, kv: list[torch.Tensor]) -> None:
        inputs = [input_ids, position_ids, cache_position, pad_mask, *kv]
        check_step_inputs(self.contract, inputs, chunk=True)
        self.chunk_step(*inputs)


class EagerBackend(Backend):
    name = "eager"

    def open(self, bundle: Path, model, manifest, config) -> EagerDecode:
        return EagerDecode(model, DecodeContract.of(manifest))


BACKEND = EagerBackend()
