"""Comparison helpers shared by the parity tests."""

from __future__ import annotations

import torch

LOGIT_ATOL = 1e-4  # fp32


def hf_generate(model, inputs: dict, new_tokens: int):
    """HF eager generate, greedy, forced to produce exactly `new_tokens` tokens; returns (ids, raw logits)."""
    out = model.generate(
        **inputs,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    return out.sequences, torch.stack(out.logits, dim=1)  # (B, S + n), (B, n, vocab)


def aot_generate(rt, inputs: dict, new_tokens: int):
    """The runtime's greedy generate with the same forcing; returns (ids, raw logits)."""
    tokens, logits = [], []
    for token, step_logits in rt.iter_steps(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens):
        tokens.append(token)
        logits.append(step_logits)
    ids = torch.cat([inputs["input_ids"], torch.stack(tokens, dim=1)], dim=1)
    return ids, torch.stack(logits, dim=1)


def assert_parity(rt, model, inputs: dict, new_tokens: int, logit_steps: int | None = None):
    """Greedy tokens identical, and raw logits within LOGIT_ATOL on the first `logit_steps` steps (all by default).

    Logits are compared where both sides have seen the same tokens, i.e. while tokens agree (all steps here)."""
    ref_ids, ref_logits = hf_generate(model, inputs, new_tokens)
    ids, logits = aot_generate(rt, inputs, new_tokens)
    assert ids.shape == ref_ids.shape
    mismatch = (ids != ref_ids).nonzero()
    assert mismatch.numel() == 0, f"tokens differ first at (row, position) {mismatch[0].tolist()}"
    steps = logit_steps or new_tokens
    diff = (logits[:, :steps] - ref_logits[:, :steps].float()).abs().max().item()
    assert diff < LOGIT_ATOL, f"max |logit diff| {diff:.3g} over the first {steps} steps"
    return diff


def chat(rt_or_tok, conversations: list[list[dict]]) -> dict:
    """A left-padded batch from chat messages, through the bundle's own tokenizer/processor."""
    processor = getattr(rt_or_tok, "processor", rt_or_tok)
    return dict(
        processor.apply_chat_template(
            conversations,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
            padding=True,
        )
    )
