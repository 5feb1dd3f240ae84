"""Chat messages, chat templates and images to model inputs: one path for `run`, `chat`, sessions and
`serve`.

Owns: the message layout (HF chat messages whose content is a string, or typed items for VLMs:
`{"type": "text", "text": ...}`, `{"type": "image", "image": PIL image}`), rendering a conversation
with the bundle's own chat template into what `rt.generate` takes, and decoding images (files or
data: URLs) under a pixel limit, each checked before any model work so that a bad image fails here and
not inside the model. Remote image URLs are refused: a bundle runs offline.
"""

from __future__ import annotations

import base64
import binascii
import io

from runtime.errors import ImageInputError, InvalidInputError

# PIL's own limit refuses images of more than 2x its MAX_IMAGE_PIXELS (decompression bombs); `max_pixels`
# sets a tighter one where untrusted clients send images (aotpack serve's --max-image-pixels).


def user_message(text: str, images=()) -> dict:
    """A user turn: plain text, or the images first and then the text, as typed items."""
    if not images:
        return {"role": "user", "content": text}
    return {
        "role": "user",
        "content": [*({"type": "image", "image": im} for im in images), {"type": "text", "text": text}],
    }


def conversation(system: str | None, messages: list[dict]) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + list(messages)


def has_chat_template(rt) -> bool:
    return bool(getattr(rt.processor, "chat_template", None))


def chat_inputs(rt, messages: list[dict]) -> dict:
    """`messages` rendered with the bundle's chat template and tokenized: input_ids, attention_mask and,
    with images, pixel_values and token_type_ids. A text bundle's template gets plain-string content
    (every text template takes it); a VLM's gets typed items."""
    if not has_chat_template(rt):
        raise InvalidInputError("this bundle has no chat template; send a plain prompt (a completion) instead")
    normalized = template_messages(messages, rt.is_multimodal)
    try:
        inputs = rt.processor.apply_chat_template(
            normalized, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
        )
    except (ValueError, TypeError, KeyError) as e:  # e.g. a template that refuses the role order
        raise InvalidInputError(f"the bundle's chat template refused these messages: {e}") from None
    return dict(inputs)


def prompt_inputs(rt, text: str) -> dict:
    """Plain text, tokenized as the bundle's tokenizer does (no template)."""
    return dict(rt.tokenizer(text, return_tensors="pt"))


def template_messages(messages: list[dict], multimodal: bool) -> list[dict]:
    """The messages as the bundle's template takes them: typed items for a VLM (the layout HF's
    processors document), plain-string content for a text bundle."""
    return [_content_for(m, multimodal) for m in messages]


def _content_for(message: dict, multimodal: bool) -> dict:
    content = message["content"]
    items = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    if multimodal:
        return {**message, "content": items}
    if any(item.get("type") != "text" for item in items):
        raise ImageInputError("this bundle is text-only; send messages without images")
    return {**message, "content": "".join(item.get("text") or "" for item in items)}


def open_images(paths, max_pixels: int | None = None) -> list:
    """Each image file, decoded to RGB."""
    images = []
    for path in paths:
        try:
            images.append(_decode(lambda p=path: _open(p), repr(str(path)), max_pixels))
        except FileNotFoundError:
            raise ImageInputError(f"image file {str(path)!r} does not exist") from None
    return images


def _open(path):
    from PIL import Image

    return Image.open(path)


def decode_image(url: str, max_pixels: int | None = None):
    """A data: URL (base64) to an RGB image; its size is checked from the header, before decoding."""
    if not url.startswith("data:"):
        raise ImageInputError("image_url must be a data: URL (base64); aotpack serve fetches nothing remote")
    header, _, payload = url.partition(",")
    if ";base64" not in header:
        raise ImageInputError("image_url data: URLs must be base64-encoded (data:image/png;base64,...)")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageInputError("image_url holds invalid base64") from None
    from PIL import Image

    return _decode(lambda: Image.open(io.BytesIO(data)), "image_url", max_pixels)


def _decode(opener, name: str, max_pixels: int | None):
    """Open (reading the header only), check the size, then decode fully, so that a bad image fails
    here; every failure is an ImageInputError naming `name`."""
    from PIL import Image, UnidentifiedImageError

    try:
        with opener() as img:
            width, height = img.size
            if max_pixels is not None and width * height > max_pixels:
                raise ImageInputError(
                    f"image of {width}x{height} pixels exceeds this server's limit of {max_pixels} pixels"
                )
            return img.convert("RGB")
    except Image.DecompressionBombError as e:
        raise ImageInputError(f"{name} is too large to decode safely ({e})") from None
    except FileNotFoundError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise ImageInputError(f"{name} is not a readable image ({e}); pass a PNG, JPEG or other PIL format") from None
