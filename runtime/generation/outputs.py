"""What `generate` returns, and how a generation feeds a streamer.

Owns the drop-in outputs: (B, S + new) ids, or with `return_dict_in_generate` transformers' own
GenerateDecoderOnlyOutput (`GenerateOutput`, a subclass that also says why each sequence ended), and
feeding an HF streamer (TextStreamer, TextIteratorStreamer, ...) as `generate` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.generation import GenerateDecoderOnlyOutput

from runtime.engine.handle import Handle


@dataclass
class GenerateOutput(GenerateDecoderOnlyOutput):
    """transformers' output, plus `finish_reasons`: per sequence, why it ended (runtime.engine.status
    FinishReason, a str: "eos", "stop_string", "length", "time", "criterion", "cancelled", "failed")."""

    finish_reasons: tuple[str, ...] | None = None


def streamed(handle: Handle, streamer=None):
    """Iterate `handle`, feeding `streamer` as `generate` does: the prompt, each step's tokens, then
    `end()`, also when the generation fails or is interrupted, so a consumer iterating the streamer
    (TextIteratorStreamer in another thread) is never left waiting. A token reaches the caller before
    the streamer shows it: interrupted (Ctrl-C), the caller has at least what was shown."""
    try:
        if streamer is not None:
            streamer.put(handle.request.input_ids.cpu())
        for token, logits in handle:
            yield token, logits
            if streamer is not None:
                streamer.put(token.cpu())
    finally:
        if streamer is not None:
            streamer.end()


def collect(handle: Handle, streamer=None):
    """A whole generation as `generate` returns it."""
    config, tokens, logits = handle.request.config, [], []
    for token, step_logits in streamed(handle, streamer):
        tokens.append(token)
        logits.append(step_logits)
    sequences = torch.cat([handle.request.input_ids, torch.stack(tokens, dim=1)], dim=1)  # (b, S + new)
    if not config.return_dict_in_generate:
        return sequences
    return GenerateOutput(
        sequences=sequences,
        scores=tuple(handle.scores) if config.output_scores else None,
        logits=tuple(logits) if config.output_logits else None,
        finish_reasons=handle.finish_reasons,
    )
