"""OpenAI chat messages and prompts to model inputs, through the bundle's own chat template.

Owns: turning `messages` (text, and `image_url` parts carrying data: URLs for VLM bundles) into what
`rt.generate` takes, and decoding images under a pixel limit before any model work. Remote image URLs
are refused: a bundle runs offline.
"""

from __future__ import annotations

import base64
import binascii
import io

from runtime.errors import ImageInputError, InvalidInputError

ROLES = {"developer": "system"}  # OpenAI's newer name for the system role


def chat_inputs(rt, messages, max_image_pixels: int) -> dict:
    if not getattr(rt.processor, "chat_template", None):
        raise InvalidInputError("this bundle has no chat template; send a plain prompt to /v1/completions")
    converted = [_message(m, rt.manifest.is_multimodal, max_image_pixels) for m in messages]
    try:
        inputs = rt.processor.apply_chat_template(
            converted, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
        )
    except (ValueError, TypeError, KeyError) as e:  # e.g. a template that refuses the role order
        raise InvalidInputError(f"the bundle's chat template refused these messages: {e}") from None
    return dict(inputs)


def prompt_inputs(rt, prompt: str) -> dict:
    return dict(rt.tokenizer(prompt, return_tensors="pt"))


def _message(message, multimodal: bool, max_pixels: int) -> dict:
    role = ROLES.get(message.role, message.role)
    parts = [{"type": "text", "text": message.content}] if isinstance(message.content, str) else message.content
    content = []
    for part in parts:
        if isinstance(part, dict):
            content.append(part)
        elif part.type == "text":
            content.append({"type": "text", "text": part.text or ""})
        elif not multimodal:
            raise ImageInputError("this bundle is text-only; send messages without image_url parts")
        else:
            content.append({"type": "image", "image": decode_image(part.image_url.url, max_pixels)})
    if not multimodal:  # every text chat template takes plain-string content
        return {"role": role, "content": "".join(p["text"] for p in content)}
    return {"role": role, "content": content}


def decode_image(url: str, max_pixels: int):
    """A data: URL (base64) to an RGB PIL image; its size is checked from the header, before decoding."""
    from PIL import Image, UnidentifiedImageError

    if not url.startswith("data:"):
        raise ImageInputError("image_url must be a data: URL (base64); aotpack serve fetches nothing remote")
    header, _, payload = url.partition(",")
    if ";base64" not in header:
        raise ImageInputError("image_url data: URLs must be base64-encoded (data:image/png;base64,...)")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageInputError("image_url holds invalid base64") from None
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            if width * height > max_pixels:
                raise ImageInputError(
                    f"image of {width}x{height} pixels exceeds this server's limit of {max_pixels} pixels"
                )
            return img.convert("RGB")
    except Image.DecompressionBombError as e:
        raise ImageInputError(f"image refused as a decompression bomb ({e})") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise ImageInputError(f"image_url is not a readable image ({e})") from None
