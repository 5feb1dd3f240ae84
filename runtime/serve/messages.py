"""OpenAI chat messages and prompts to model inputs.

Owns: turning OpenAI's `messages` (text, and `image_url` parts carrying data: URLs for VLM bundles)
into HF chat messages, with every image decoded under the server's pixel limit before any model work;
rendering and images are runtime.inputs'.
"""

from __future__ import annotations

from runtime.errors import ImageInputError
from runtime.inputs import chat_inputs, decode_image, prompt_inputs

ROLES = {"developer": "system"}  # OpenAI's newer name for the system role

__all__ = ["chat_messages", "chat_inputs", "prompt_inputs"]


def chat_messages(messages, multimodal: bool, max_pixels: int) -> list[dict]:
    return [_message(m, multimodal, max_pixels) for m in messages]


def _message(message, multimodal: bool, max_pixels: int) -> dict:
    role = ROLES.get(message.role, message.role)
    if isinstance(message.content, str):
        return {"role": role, "content": message.content}
    content = []
    for part in message.content:
        if part.type == "text":
            content.append({"type": "text", "text": part.text or ""})
        elif not multimodal:
            raise ImageInputError("this bundle is text-only; send messages without image_url parts")
        else:
            content.append({"type": "image", "image": decode_image(part.image_url.url, max_pixels)})
    return {"role": role, "content": content}
