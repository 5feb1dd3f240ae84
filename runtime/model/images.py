"""What a model's config says about images: whether it takes them, and which token stands for one.

Owns the one check, used by validation, prefill and sessions, of whether token ids hold an image token.
"""

from __future__ import annotations

import torch


def is_multimodal(config) -> bool:
    return getattr(config, "vision_config", None) is not None


def image_token_id(config) -> int | None:
    return getattr(config, "image_token_id", None)


def holds_image(config, ids: torch.Tensor) -> bool:
    """Whether any of `ids` (any shape) is the model's image token."""
    token = image_token_id(config)
    return token is not None and bool((ids == token).any())
