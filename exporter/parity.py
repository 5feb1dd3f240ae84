"""The export-time parity gate: eager HF `generate` against eager prefill + the compiled decode.

Owns: the parity report in the manifest. The compiled decode is fed the reference's own tokens
(teacher forcing), so one early difference cannot hide the rest, and every step's raw logits are
compared. A failed gate fails the export: no bundle is written.
"""

from __future__ import annotations

import torch

from runtime.cache import allocate
from runtime.errors import ExportError
from runtime.manifest import Parity
from runtime.prefill import start

# Allowed max |logit difference|, relative to the largest reference logit (at least 1).
RELATIVE_TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 5e-2}


def parity_prompt(tokenizer, batch: int, max_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A left-padded batch of at most `max_len` tokens (ids (b, S), mask (b, S)): row i drops the i
    tokens after the first. The first (BOS) stays in every row: without it Gemma's activations grow so
    large that bf16 rounding alone moved its logits by 30 (HF against HF, the same row padded and not)."""
    ids = tokenizer("Why is the sky blue? Compilers turn programs into machine code.", return_tensors="pt").input_ids
    ids = ids[0, -max_len:].to(device)  # (S,)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    drops = [min(row, ids.shape[0] - 1) for row in range(batch)]
    rows = [torch.cat([ids.new_full((d,), pad), ids[:1], ids[1 + d :]]) for d in drops]
    mask = torch.stack([torch.cat([torch.zeros(d), torch.ones(ids.shape[0] - d)]) for d in drops]).long()
    return torch.stack(rows), mask.to(device)


@torch.inference_mode()
def check_parity(
    model, decodes: dict, layout, tokenizer, dtype: str, batch: int, steps: int, max_cache_len: int
) -> dict[str, Parity]:
    """Each of `decodes` ({name in the error: decode}) against one eager generate, teacher-forced;
    returns each one's report, or raises for the first that fails."""
    device = next(model.parameters()).device
    ids, mask = parity_prompt(tokenizer, min(batch, 2), max(1, max_cache_len // 2), device)  # leave room to decode
    steps = min(steps, max_cache_len - ids.shape[1])
    ref = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=steps,
        min_new_tokens=steps,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    ref_tokens = ref.sequences[:, ids.shape[1] :]  # (b, steps)
    reports = {}
    for what, decode in decodes.items():
        ours = _teacher_forced(model, decode, layout, ids, mask, ref_tokens, dtype, max_cache_len)
        reports[what] = _report(what, ours, ref.logits, steps, dtype)
    return reports


def _report(what: str, ours: list[torch.Tensor], ref_logits, steps: int, dtype: str) -> Parity:
    diff = max((o - r.float()).abs().max().item() for o, r in zip(ours, ref_logits, strict=True))
    scale = max(1.0, max(r.float().abs().max().item() for r in ref_logits))
    tolerance = RELATIVE_TOLERANCE[dtype] * scale
    match = all(torch.equal(o.argmax(-1), r.argmax(-1)) for o, r in zip(ours, ref_logits, strict=True))
    report = Parity(steps=steps, max_abs_logit_diff=diff, tolerance=tolerance, tokens_match=match)
    if diff > tolerance or (dtype == "float32" and not match):
        raise ExportError(
            f"parity check failed: {what} differs from eager generate by {diff:.3g} "
            f"(tolerance {tolerance:.3g}), tokens match: {match}; no bundle was written"
        )
    return report


def _teacher_forced(model, decode, layout, ids, mask, tokens, dtype, max_cache_len) -> list[torch.Tensor]:
    kv = allocate(layout, ids.shape[0], getattr(torch, dtype), ids.device)
    first, rows = start(model, decode, kv, layout, ids, mask, max_cache_len)
    logits = [first]  # each (b, vocab)
    everyone = torch.ones(ids.shape[0], dtype=torch.bool, device=ids.device)
    for step in range(tokens.shape[1] - 1):
        rows.advance(everyone)
        logits.append(decode(tokens[:, step : step + 1].contiguous(), *rows.inputs(ids.shape[0]), kv))
    return logits
