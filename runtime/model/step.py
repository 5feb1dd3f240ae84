"""The single-token decode step as an `nn.Module`: what the exporter traces, and what the eager
backend runs as it is.

Owns: the step's computation. Its inputs are runtime.format.contract's STEP_INPUTS (per row: the new
token, its rotary position, its absolute cache index, the padding mask over cache indices) and the flat
KV cache; the output is the next-token logits. The cache tensors are graph *inputs*, so the compiled
kernels write the caller's tensors in place and the eager prefill and the compiled decode share one
cache.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.model.cache import SlotCache
from runtime.model.images import is_multimodal
from runtime.model.masks import additive_mask_dtype, decode_masks, mask_argument


class TextHead(nn.Module):
    """A VLM's text decoder plus `lm_head`, so the decode graph holds no vision weights.

    Mirrors what e.g. `Gemma3ForConditionalGeneration.forward` does for text-only input.
    """

    def __init__(self, language_model: nn.Module, lm_head: nn.Module):
        super().__init__()
        self.language_model = language_model
        self.lm_head = lm_head

    def forward(self, input_ids, attention_mask, position_ids, cache, use_cache):
        out = self.language_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
        )
        return self.lm_head(out.last_hidden_state[:, -input_ids.shape[1] :])


class DecodeStep(nn.Module):
    """input_ids (B, T), position_ids (B, T), cache_position (B,), pad_mask (B, span) bool, *kv -> logits
    (B, vocab) when T = 1, (B, T, vocab) when T > 1.

    Every row is its own sequence at its own cache position: one call advances each by one token, and
    attends to cache indices [0, span) only (the pad mask's width). A verify step (T = k + 1) takes a
    row's next token and k drafted ones after it at once, each attending causally to those before it,
    and gives the logits after each: speculative decoding accepts the drafts they agree with.
    With `returns_written` (the ONNX step) it also returns each layer's new keys and values, each
    (B, kv_heads, 1, head_dim), keys then values per layer: ONNX keeps no in-place update of an input,
    so the runtime writes them into the cache itself (runtime.model.cache.write_token).
    Without `head` (the chunk graph: a prompt's tokens into the cache) the `lm_head` stays out: it returns
    the last token's final hidden state (B, hidden) fp32, and what it is for is the keys and values it
    writes."""

    def __init__(
        self,
        lm: nn.Module,
        layout,
        is_text_head: bool,
        additive_mask_dtype: torch.dtype | None = None,
        returns_written: bool = False,
        head: bool = True,
    ):
        super().__init__()
        self.lm = lm
        self.layout = tuple(layout)
        self.is_text_head = is_text_head
        self.additive_mask_dtype = additive_mask_dtype  # eager attention (no SDPA) adds float masks
        self.returns_written = returns_written
        self.head = head

    def without_head(self) -> DecodeStep:
        """The same step over the same modules (so its constants have the same names), without `lm_head`."""
        return DecodeStep(self.lm, self.layout, self.is_text_head, self.additive_mask_dtype, head=False)

    def forward(self, input_ids, position_ids, cache_position, pad_mask, *kv):
        tokens = input_ids.shape[1]
        cache = SlotCache(list(kv), self.layout, cache_position, span=pad_mask.shape[1])
        masks = decode_masks(pad_mask, cache_position, self.layout, tokens)
        mask = mask_argument(masks, self.additive_mask_dtype)
        kwargs = dict(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, cache=cache, use_cache=True)
        if not self.head:
            base = self.lm.language_model if self.is_text_head else getattr(self.lm, self.lm.base_model_prefix)
            return base(**kwargs).last_hidden_state[:, -1].float()  # (B, hidden)
        if self.is_text_head:
            logits = self.lm(**kwargs)  # (B, T, vocab)
        else:
            logits = self.lm(**kwargs, logits_to_keep=tokens).logits  # (B, T, vocab)
        logits = logits[:, -1].float() if tokens == 1 else logits.float()  # (B, vocab) or (B, T, vocab); fp32 as HF
        if not self.returns_written:
            return logits
        return (logits, *(state for layer in cache.layers for state in layer.written))


def decode_step(model: nn.Module, layout, returns_written: bool = False) -> DecodeStep:
    """The decode step over the text path only: a VLM's vision tower stays out of it.
    `returns_written`: the ONNX step, which also returns the keys and values it wrote."""
    additive = additive_mask_dtype(model)
    if is_multimodal(model.config):
        head = TextHead(model.get_decoder(), model.get_output_embeddings())
        return DecodeStep(head, layout, True, additive, returns_written)
    return DecodeStep(model, layout, False, additive, returns_written)
