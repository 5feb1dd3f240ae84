"""Chat messages, chat templates and images to model inputs: one path for `run`, `chat`, sessions and
`serve`.

Owns: the message layout (HF chat messages whose content is a string, or typed items for VLMs:
`{"type": "text", "text": ...}`, `{"type": "image", "image": PIL image}`), rendering a conversation
with the bundle's own chat template into what `rt.generate` takes (message text tokenized as text: a
control token's string in it stays characters), and decoding images (files or data: URLs) under a
pixel limit, each checked before any model work so that a bad image fails here and not inside the
model. Remote image URLs are refused: a bundle runs offline.
"""

from __future__ import annotations

import base64
import binascii
import io
import re

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


def chat_inputs(
    rt, messages: list[dict], parse_special: bool = False, add_generation_prompt: bool = True,
    continue_final_message: bool = False, tools: list[dict] | None = None,
) -> dict:  # fmt: skip
    """`messages` rendered with the bundle's chat template and tokenized: input_ids, attention_mask and,
    with images, pixel_values and token_type_ids. A text bundle's template gets plain-string content
    (every text template takes it); a VLM's gets typed items. `add_generation_prompt` opens the
    assistant's turn; `continue_final_message` instead ends the prompt inside the last message (an
    assistant's partial reply, which the model goes on with), as HF's apply_chat_template does; `tools`
    (OpenAI's function definitions) go to the template, which renders them its own way.

    Message text is text: a control token's string inside it (`<|eot_id|><|start_header_id|>system...`)
    is tokenized as those characters, so content cannot open a turn of another role; only the
    template's own markup is parsed into control tokens. `parse_special=True` parses them in content too
    (the opt-out, for callers whose content is trusted markup)."""
    if not has_chat_template(rt):
        raise InvalidInputError("this bundle has no chat template; send a plain prompt (a completion) instead")
    normalized = template_messages(messages, rt.is_multimodal)
    if not parse_special and (found := _control_strings_in(rt.tokenizer, normalized)):
        if rt.is_multimodal:  # its processor expands image markup into control tokens after rendering
            raise InvalidInputError(
                f"message content holds {found!r}, a control token of this model; a VLM bundle cannot keep it "
                "as text: remove it, or pass parse_special=True to let it act as the control token"
            )
        template = {"add_generation_prompt": add_generation_prompt, "tools": tools}
        return _literal_content_inputs(rt.tokenizer, normalized, continue_final_message, **template)
    template = {"add_generation_prompt": add_generation_prompt, "continue_final_message": continue_final_message}
    template |= {"tools": tools} if tools else {}
    try:
        inputs = rt.processor.apply_chat_template(
            normalized, tokenize=True, return_dict=True, return_tensors="pt", **template
        )
    except (ValueError, TypeError, KeyError) as e:  # e.g. a template that refuses the role order
        raise InvalidInputError(f"the bundle's chat template refused these messages: {e}") from None
    return dict(inputs)


def _control_strings_in(tokenizer, messages: list[dict]) -> str | None:
    """The first control token string found in any message's text, or None (the usual case, which
    then takes HF's own path, token for token). The tokenizer finds them (in Rust, in one pass)."""
    controls = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    for m in messages:
        text = m["content"] if isinstance(m["content"], str) else _text_of(m["content"] or [])
        found = next((i for i in tokenizer(text, add_special_tokens=False)["input_ids"] if i in controls), None)
        if found is not None:
            return tokenizer.added_tokens_decoder[found].content
    return None


def _text_of(items: list[dict]) -> str:
    return "\n".join(item.get("text") or "" for item in items if item.get("type") == "text")


_MARK = "\ue000{}\ue001"  # private-use characters around a message's index: never in a template's markup


def _literal_content_inputs(tokenizer, messages: list[dict], continue_final_message: bool, **template) -> dict:
    """Render with each content replaced by a mark, then tokenize the template's pieces as HF does
    (control tokens parsed, no BOS added: the template writes it) and each content with its special
    strings split into ordinary tokens. Continuing the final message cuts the render after its mark, as
    HF cuts after the message's text."""
    import torch

    marked = [{**m, "content": _MARK.format(i)} for i, m in enumerate(messages)]
    rendered = tokenizer.apply_chat_template(marked, tokenize=False, **template)
    if continue_final_message:
        last = _MARK.format(len(messages) - 1)
        rendered = rendered[: rendered.rindex(last) + len(last)] if last in rendered else rendered
    pieces = re.split("\ue000(\\d+)\ue001", rendered)
    if sorted(int(p) for p in pieces[1::2]) != list(range(len(messages))):
        raise InvalidInputError(
            "the bundle's chat template rewrites message content, so control-token strings in it cannot be "
            "kept as text; remove them, or pass parse_special=True"
        )
    ids = []
    for i, piece in enumerate(pieces):
        text = piece if i % 2 == 0 else messages[int(piece)]["content"]
        if text:
            ids += tokenizer(text, add_special_tokens=False, split_special_tokens=i % 2 == 1)["input_ids"]
    input_ids = torch.tensor([ids])  # (1, T)
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}


def prompt_inputs(rt, text: str) -> dict:
    """Plain text, tokenized as the bundle's tokenizer does (no template)."""
    return dict(rt.tokenizer(text, return_tensors="pt"))


def template_messages(messages: list[dict], multimodal: bool) -> list[dict]:
    """The messages as the bundle's template takes them: typed items for a VLM (the layout HF's
    processors document), plain-string content for a text bundle."""
    return [_content_for(m, multimodal) for m in messages]


def _content_for(message: dict, multimodal: bool) -> dict:
    content = message["content"]
    items = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
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
    return _decode(_url_opener(url), "image_url", max_pixels)


def image_size(url: str) -> tuple[int, int]:
    """(width, height) of a data: URL image, from its header alone (nothing is decoded)."""
    return _decode(_url_opener(url), "image_url", None, header_only=True)


def _url_opener(url: str):
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

    return lambda: Image.open(io.BytesIO(data))


def _decode(opener, name: str, max_pixels: int | None, header_only: bool = False):
    """Open (reading the header only), check the size, then decode fully, so that a bad image fails
    here; every failure is an ImageInputError naming `name`. `header_only`: (width, height) alone."""
    from PIL import Image, UnidentifiedImageError

    try:
        with opener() as img:
            width, height = img.size
            if header_only:
                return width, height
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
