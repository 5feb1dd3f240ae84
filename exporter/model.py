"""Loading the checkpoint eagerly and describing its decode-time shape.

Owns: choosing the transformers class (causal LM or image-text-to-text), locating a VLM's text
decoder and `lm_head`, refusing models without a supported decode cache, and the per-layer cache
layout (full-length or sliding ring buffer) derived from the text config.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, GenerationMixin

from exporter import compat
from runtime.errors import ExportError
from runtime.format.layout import FULL, SLIDING, LayerLayout
from runtime.model.images import is_multimodal
from runtime.model.step import DecodeStep, decode_step


def load_model(checkpoint: Path, dtype: str, device: str) -> tuple[nn.Module, str]:
    """(the eager model, its attention implementation): SDPA where the model supports it, else eager
    attention (Gemma 2's logit softcapping has no SDPA form); the parity gate checks either."""
    config = AutoConfig.from_pretrained(checkpoint, local_files_only=True)
    auto = AutoModelForImageTextToText if is_multimodal(config) else AutoModelForCausalLM
    for attention in ("sdpa", "eager"):
        try:
            model = auto.from_pretrained(
                checkpoint, dtype=getattr(torch, dtype), local_files_only=True, attn_implementation=attention
            )
            return model.to(device).eval(), attention
        except ValueError as e:  # transformers' "Unrecognized configuration class ...", or no SDPA support
            if "scaled_dot_product_attention" not in str(e):
                raise ExportError(f"{type(config).__name__} has no causal-LM or image-text-to-text class: {e}") from e
    raise ExportError(f"{type(config).__name__} could not be loaded with SDPA or eager attention")


def text_config(model: nn.Module):
    return model.config.get_text_config(decoder=True)


def cache_layout(
    model: nn.Module, max_cache_len: int, draft_tokens: int = 0, chunk_tokens: int = 0
) -> tuple[LayerLayout, ...]:
    """One LayerLayout per decoder layer; refuses layer kinds the decode step cannot hold. A ring holds
    `draft_tokens` slots beyond its window: a verify step writes that many drafted tokens past a row's
    last, and a rejected one then overwrites only a token that has left every later query's window
    (runtime.format.layout). The chunk graph writes `chunk_tokens` at once: C - 1 slots beyond."""
    spare = max(draft_tokens, chunk_tokens - 1)
    config = text_config(model)
    layer_types, layer_kwargs = compat.layer_types_and_kwargs(config)
    num_kv_heads, head_dim = compat.head_shapes(config)
    n = len(layer_types)
    heads = num_kv_heads if isinstance(num_kv_heads, list) else [num_kv_heads] * n
    dims = head_dim if isinstance(head_dim, list) else [head_dim] * n
    layout = []
    for kind, kwargs, h, d in zip(layer_types, layer_kwargs, heads, dims, strict=True):
        if kind == FULL:
            layout.append(LayerLayout(FULL, max_cache_len, None, h, d))
        elif kind == SLIDING:
            window = kwargs["sliding_window"]
            layout.append(LayerLayout(SLIDING, min(window + spare, max_cache_len), window, h, d))
        else:
            raise ExportError(
                f"{type(model).__name__} has a {kind!r} layer; aotpack's decode cache supports only "
                f"{FULL!r} and {SLIDING!r} layers"
            )
    if len({layer.window for layer in layout if layer.kind == SLIDING}) > 1:
        raise ExportError(
            f"{type(model).__name__} mixes several sliding windows; aotpack supports one window per model"
        )
    return tuple(layout)


def decode_module(model: nn.Module, layout, returns_written: bool = False) -> DecodeStep:
    """The decode step to trace (runtime.model.step), for decoder LMs only."""
    if not isinstance(model, GenerationMixin):
        raise ExportError(f"{type(model).__name__} has no generation KV cache; aotpack exports decoder LMs only")
    return decode_step(model, layout, returns_written)
