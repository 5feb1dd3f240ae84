"""The export-time parity gate: eager HF `generate` against the runtime's engine over the compiled decode.

Owns: the parity report in the manifest. The request runs through the very engine that serves requests
(runtime.engine: validation, admission, eager prefill, decode steps), fed the reference's own tokens
(teacher forcing, a logits processor that forces each next token), so one early difference cannot hide
the rest, and every step's raw logits are compared. A failed gate fails the export: no bundle is
written.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from runtime.engine.engine import Engine
from runtime.errors import AotpackError, ExportError
from runtime.format.contract import DecodeContract
from runtime.format.manifest import Parity
from runtime.generation.validate import Validator

# Allowed max |logit difference|, relative to the largest reference logit (at least 1).
RELATIVE_TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 5e-2}
# With the integer kernels the activations are rounded to int8 at every linear layer, and rounding is not
# continuous: a last-bit difference upstream (HF's attention against the engine's, eager against
# Inductor's fused norms) moves a value across a rounding boundary now and then, one step of 1/127 of its
# block's largest value. Such a flip is quantization noise, not a bug: on Gemma 3 270M int8 the bundle's
# *eager* decode step differs from HF generate by 0.67 (of 24) after one, while a wrong kernel moves every
# logit by the whole scale. Where the reference's two best tokens are closer than that noise, the greedy
# choice may differ (a left-padded batch of two on Gemma 3 270M did, 0.65 apart): the logits are the gate,
# and `tokens_match` reports what happened.
INTEGER_TOLERANCE = 5e-2


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


def chunk_prompt(tokenizer, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """One row of `length` tokens (ids (1, S), mask (1, S)): the parity text repeated after its first
    token, long enough to take several calls of a chunk graph and end in a padded one."""
    ids = tokenizer("Why is the sky blue? Compilers turn programs into machine code.", return_tensors="pt").input_ids[0]
    body = ids[1:].repeat(length // max(1, ids.shape[0] - 1) + 1)
    row = torch.cat([ids[:1], body])[:length].to(device)  # (S,)
    return row[None], torch.ones_like(row)[None]


@torch.inference_mode()
def check_parity(
    model,
    decodes: dict,
    contract: DecodeContract,
    tokenizer,
    steps: int,
    rows: int,
    integer: bool = False,
    verify: bool = False,
    chunk: bool = False,
) -> dict[str, Parity]:
    """Each of `decodes` ({name in the error: decode}) against one eager generate of a left-padded batch
    of `rows` rows, teacher-forced; returns each one's report, or raises for the first that fails.
    `integer`: the model's linear layers quantize their activations (INTEGER_TOLERANCE). `verify`: the
    rows go as `rows` one-row requests that draft the reference's own tokens, so that their steps are
    verify steps accepting every draft (runtime.engine.speculation), each row against its own generate.
    `chunk`: one row whose prompt (2 C + 3 tokens, within half the cache) goes in through the chunk graph
    (C tokens a call, the last padded), the decode steps after it compared."""
    if chunk:
        ids, mask = chunk_prompt(
            tokenizer, min(contract.max_cache_len // 2, 2 * contract.chunk_tokens + 3), contract.device
        )
    else:
        ids, mask = parity_prompt(tokenizer, rows, max(1, contract.max_cache_len // 2), contract.device)
    steps = min(steps, contract.max_cache_len - ids.shape[1])  # leave room to decode
    prompts = [ids[r : r + 1, -int(mask[r].sum()) :] for r in range(rows)] if verify else [ids]
    refs = [_generate(model, p, torch.ones_like(p) if verify else mask, steps) for p in prompts]
    ref_tokens = torch.cat([r.sequences[:, r.sequences.shape[1] - steps :] for r in refs])  # (b, steps)
    ref_logits = [torch.cat(step) for step in zip(*(r.logits for r in refs), strict=True)]  # steps x (b, vocab)
    reports = {}
    for what, decode in decodes.items():
        if verify:
            ours = _drafted(model, decode, contract, tokenizer, prompts, ref_tokens)
        else:
            ours = _teacher_forced(model, decode, contract, tokenizer, ids, mask, ref_tokens, chunk)
        if len(ours) != steps:
            raise ExportError(f"parity check failed: {what} stopped after {len(ours)} of {steps} forced steps")
        relative = max(RELATIVE_TOLERANCE[contract.dtype], INTEGER_TOLERANCE if integer else 0.0)
        reports[what] = _report(what, ours, ref_logits, steps, relative, contract.dtype == "float32" and not integer)
    return reports


def _generate(model, ids, mask, steps: int):
    return model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=steps,
        min_new_tokens=steps,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )


def _report(what: str, ours: list[torch.Tensor], ref_logits, steps: int, relative: float, tokens: bool) -> Parity:
    """`tokens`: greedy tokens must match too (float32, unless the integer kernels round activations)."""
    diff = max((o - r.float()).abs().max().item() for o, r in zip(ours, ref_logits, strict=True))
    scale = max(1.0, max(r.float().abs().max().item() for r in ref_logits))
    tolerance = relative * scale
    match = all(torch.equal(o.argmax(-1), r.argmax(-1)) for o, r in zip(ours, ref_logits, strict=True))
    report = Parity(steps=steps, max_abs_logit_diff=diff, tolerance=tolerance, tokens_match=match)
    if diff > tolerance or (tokens and not match):
        raise ExportError(
            f"parity check failed: {what} differs from eager generate by {diff:.3g} "
            f"(tolerance {tolerance:.3g}), tokens match: {match}; no bundle was written"
        )
    return report


class _Forced:
    """A logits processor that leaves only the reference's next token, so the engine's greedy choice
    feeds the compiled step what eager generate fed the model."""

    def __init__(self, tokens: torch.Tensor, prompt_len: int):
        self.tokens, self.prompt_len = tokens, prompt_len  # (b, steps)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        forced = self.tokens[:, input_ids.shape[1] - self.prompt_len]  # (b,)
        return torch.full_like(scores, -float("inf")).scatter(1, forced[:, None], 0.0)


class _Reference:
    """Drafts the reference's own next tokens (a drafter as runtime.engine.speculation.Drafter's), so
    every draft is accepted and each verify step's logits are compared at every position."""

    def __init__(self, tokens: torch.Tensor, prompt_len: int):
        self.tokens, self.prompt_len = tokens, prompt_len  # (steps,)

    def propose(self, history: torch.Tensor, room: int) -> torch.Tensor | None:
        at = history.shape[1] - self.prompt_len
        drafts = self.tokens[at : at + room]
        return drafts if drafts.numel() else None

    def expected(self, drafts: int) -> float:
        return 1.0 + drafts

    def record(self, drafted: int, accepted: int) -> None:
        pass


def _engine(model, decode, contract, tokenizer, rows: int) -> tuple[Engine, Validator]:
    """An engine whose cache holds only `rows` rows (the decode checks its inputs against its own contract)."""
    contract = replace(contract, batch_size=rows)
    vocab = model.config.get_text_config().vocab_size
    return Engine(model, decode, contract), Validator(model, contract, vocab, tokenizer=lambda: tokenizer)


def _forced_request(validator: Validator, ids, mask, tokens: torch.Tensor):
    forced = [_Forced(tokens, ids.shape[1])]
    try:
        return validator.request(ids, mask, max_new_tokens=tokens.shape[1], do_sample=False, logits_processor=forced)
    except AotpackError as e:  # the checkpoint's own generation defaults refused (a pad id past its vocabulary)
        raise ExportError(f"parity check could not run: {e}") from None


def _teacher_forced(model, decode, contract, tokenizer, ids, mask, tokens, chunk=False) -> list[torch.Tensor]:
    """The raw logits (b, vocab) of each step, the engine fed the reference's `tokens` (b, steps).
    `chunk`: the prompt must have gone in through the decode's chunk graph."""
    calls = []
    rows = max(ids.shape[0], decode.batches[0]) if chunk else ids.shape[0]  # the chunk graph's row among idle ones
    decode = _Counting(decode, calls) if chunk else decode
    engine, validator = _engine(model, decode, contract, tokenizer, rows)
    try:
        request = _forced_request(validator, ids, mask, tokens)
        logits = [logits for _, logits in engine.submit(request, want_logits=True)]
    finally:
        engine.close()
    if chunk and len(calls) != -(-(ids.shape[1] - 1) // contract.chunk_tokens):
        raise ExportError(
            f"parity check failed: the chunk graph took {len(calls)} calls for a {ids.shape[1]}-token prompt"
        )
    return logits


class _Counting:
    """A decode whose `chunk` calls are counted (the parity gate checks the prompt took the graph)."""

    def __init__(self, decode, calls: list):
        self.decode, self.calls = decode, calls

    def __getattr__(self, name):
        return getattr(self.decode, name)

    def __call__(self, *inputs):
        return self.decode(*inputs)

    def chunk(self, *inputs):
        self.calls.append(inputs[0].shape)
        return self.decode.chunk(*inputs)


def _drafted(model, decode, contract, tokenizer, prompts: list, tokens) -> list[torch.Tensor]:
    """The raw logits (b, vocab) of each token, `prompts` (1, S_i) each its own request drafting and fed
    the reference's `tokens` (b, steps), all at once: the engine verifies them in one batch."""
    engine, validator = _engine(model, decode, contract, tokenizer, len(prompts))
    try:
        handles = []
        with engine.together():  # one batch of len(prompts) rows from the first step
            for i, ids in enumerate(prompts):
                request = _forced_request(validator, ids, torch.ones_like(ids), tokens[i : i + 1])
                handles.append(engine.submit(request, want_logits=True, drafter=_Reference(tokens[i], ids.shape[1])))
        rows = [[logits for _, logits in handle] for handle in handles]
        if ("verify", len(prompts)) not in engine.costs.seconds:
            raise ExportError(f"parity check failed: the batch-{len(prompts)} verify graph was never stepped")
        return [torch.cat(step) for step in zip(*rows, strict=False)]
    finally:
        engine.close()
