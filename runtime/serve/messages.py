"""OpenAI chat messages and prompts to model inputs.

Owns: turning OpenAI's `messages` (text, and `image_url` parts carrying data: URLs for VLM bundles)
into HF chat messages, with every image decoded under the server's pixel limit before any model work;
rendering and images are runtime.inputs'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from runtime.errors import ImageInputError
from runtime.inputs import chat_inputs, decode_image, image_size, prompt_inputs

ROLES = {"developer": "system"}  # OpenAI's newer name for the system role

__all__ = ["ImageBudget", "chat_messages", "chat_inputs", "prompt_inputs"]


@dataclass(frozen=True)
class ImageBudget:
    """What one request's images may cost, checked before any image is decoded: 16 one-bit 4096x4096
    PNGs (a 45 KiB body) took a server from 1.4 to 2.3 GiB when only each image's size was bounded."""

    multimodal: bool
    max_pixels: int  # per image (decompression bombs)
    max_request_pixels: int  # all of a request's images together
    max_images: int
    cache_slots: int  # the bundle's max_cache_len
    slots_per_image: int | None  # cache slots an image's tokens take (None where the config does not say)

    def check(self, urls: list[str]) -> None:
        if urls and not self.multimodal:
            raise ImageInputError("this bundle is text-only; send messages without image_url parts")
        if len(urls) > self.max_images:
            raise ImageInputError(f"{len(urls)} images in one request; this server takes at most {self.max_images}")
        if self.slots_per_image and len(urls) * self.slots_per_image >= self.cache_slots:
            raise ImageInputError(
                f"{len(urls)} images take {len(urls) * self.slots_per_image} cache slots, and the bundle has "
                f"{self.cache_slots}; send fewer images"
            )
        total = 0
        for url in urls:
            width, height = image_size(url)
            if width * height > self.max_pixels:
                raise ImageInputError(
                    f"image of {width}x{height} pixels exceeds this server's limit of {self.max_pixels} pixels"
                )
            total += width * height
        if total > self.max_request_pixels:
            raise ImageInputError(
                f"this request's images hold {total} pixels together, over this server's limit of "
                f"{self.max_request_pixels} per request"
            )


def chat_messages(messages, budget: ImageBudget) -> list[dict]:
    """HF chat messages, every image checked against `budget` (all of them, headers only) first."""
    parts = [part for m in messages if isinstance(m.content, list) for part in m.content]
    budget.check([_url(part) for part in parts if part.type != "text"])
    return [_message(m, budget.max_pixels) for m in messages]


def _url(part) -> str:
    if part.image_url is None:
        raise ImageInputError('an image_url part needs its image_url field: {"image_url": {"url": "data:..."}}')
    return part.image_url.url


def _message(message, max_pixels: int) -> dict:
    role = ROLES.get(message.role, message.role)
    calls = {"tool_calls": [_call(c) for c in message.tool_calls]} if message.tool_calls else {}
    calls |= {"tool_call_id": message.tool_call_id} if message.tool_call_id else {}
    if message.content is None or isinstance(message.content, str):
        return {"role": role, "content": message.content or ""} | calls
    content = []
    for part in message.content:
        if part.type == "text":
            content.append({"type": "text", "text": part.text or ""})
        else:
            content.append({"type": "image", "image": decode_image(_url(part), max_pixels)})
    return {"role": role, "content": content} | calls


def _call(call: dict) -> dict:
    """An earlier tool call as templates take it: OpenAI sends the arguments as a JSON string, chat
    templates write them with `tojson`, so a string would be written as a quoted string."""
    function = dict(call.get("function") or {})
    if isinstance(function.get("arguments"), str):
        try:
            function["arguments"] = json.loads(function["arguments"])
        except ValueError:
            pass  # not JSON: the template gets it as it came
    return {**call, "function": function}
