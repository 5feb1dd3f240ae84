"""How much of a prompt a cache row already holds: the one rule behind the prefix cache
(runtime.engine.engine) and sessions' reuse of their own row (runtime.session).

A row holds the keys and values of the tokens `held` that were fed into it. A prompt starting with the
same tokens reuses them and prefills only the rest, with two limits:
- Sliding-window rings: a layer with `slots` slots (the window, plus spare slots for drafts or a chunk
  graph's calls) keeps only the last `slots` tokens, and a row parked between requests inside the
  others' reach has each of their steps write its next slot, a verify step its next k + 1
  (runtime.engine.runner.keep; a row parked past them rests at slot 0, which is put back). Once a row
  has held `window` tokens or more, those
  writes can wrap onto its oldest slots and going back to an earlier position would read them, so such
  a row is reused only by a prompt that extends all it holds. For Gemma 3 (a window of 512) that is a
  conversation's next turn; a shared system prompt is reused across different requests only while the
  row it is kept in has held fewer than 512 tokens.
- Images: the continuing prefill is text only, so a prompt whose rest holds an image token is prefilled
  whole; and an image's placeholder tokens are the same for every image, so a prefix holding one is
  reused only when the images are the same (`same_images`: equal digests of their pixels).
"""

from __future__ import annotations

import hashlib

import torch

from runtime.model.images import image_token_id


def holding(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """What a row fed `ids` (1, T) under the prompt's `mask` (1, S) holds, slot by slot: the ids, and -1
    where the prompt was padding (tokens past the mask were generated: real). A padded slot stands only
    for another padded one: what attends to a token, and the positions after it, follow the mask, not
    the id, so the same ids under another mask are not the same prefix."""
    pads = torch.zeros_like(ids, dtype=torch.bool)  # (1, T)
    s = min(ids.shape[1], mask.shape[1])
    pads[:, :s] = mask[:, :s] == 0
    return ids.masked_fill(pads, -1)


def reusable(held: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, layout, config, same_images=True) -> int:
    """Leading tokens of the prompt `ids` (1, S) under `mask` (1, S) that a row holding `held` (1, T,
    from `holding`) can stand for: at most all but the last, which the decode step takes."""
    n = min(held.shape[1], ids.shape[1] - 1)
    common = int((held[0, :n] == holding(ids, mask)[0, :n]).long().cumprod(0).sum())
    if common < held.shape[1] and any(
        layer.window and held.shape[1] >= min(layer.window, layer.slots) for layer in layout
    ):
        return 0
    image = image_token_id(config)
    if image is not None and common > 0:
        if bool((ids[0, common:] == image).any()) or (not same_images and bool((ids[0, :common] == image).any())):
            return 0
    return common


def image_digests(model_inputs: dict) -> tuple[str, ...]:
    """One digest per image of a request's `pixel_values` (none for text): equal pixels, equal digests."""
    pixels = model_inputs.get("pixel_values")
    if pixels is None:
        return ()
    return tuple(hashlib.sha256(image.contiguous().cpu().numpy().tobytes()).hexdigest() for image in pixels)
