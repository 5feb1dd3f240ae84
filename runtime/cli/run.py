"""`aotpack run`: one chat turn from the command line, streamed to stdout with timings.

Owns: the run's frozen config, the sampling flags as generate() options, and reporting prefill ms and
decode ms/token. Messages and images go through runtime.inputs, image files checked before any model
work.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from runtime.config import LoadConfig
from runtime.errors import ImageInputError, InvalidInputError
from runtime.format.reader import read_manifest
from runtime.generation.options import check_options
from runtime.inputs import chat_inputs, conversation, has_chat_template, open_images, prompt_inputs, user_message
from runtime.text import stream_text


@dataclass(frozen=True)
class RunConfig:
    bundle: Path
    prompt: str
    system: str | None = None
    images: tuple[Path, ...] = ()
    max_new_tokens: int = 64
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    greedy: bool = False
    seed: int | None = None
    load: LoadConfig = field(default_factory=LoadConfig)

    def __post_init__(self):
        if not self.prompt:
            raise InvalidInputError("--prompt is empty; give the text to answer")
        self.options  # noqa: B018 (checks --greedy against the sampling flags)
        check_options({"max_new_tokens": self.max_new_tokens}, vocab_size=1)
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise InvalidInputError(f"--seed {self.seed} must be from 0 to 2**64 - 1")

    @property
    def options(self) -> dict:
        flags = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p}
        return sampling_options(greedy=self.greedy, repetition_penalty=self.repetition_penalty, **flags)


# llama.cpp's and Ollama's defaults. `chat` samples with them when neither the command line nor the bundle
# says how to decode: greedy decoding makes a small instruct model repeat itself within a turn or two.
CHAT_DEFAULTS = {"do_sample": True, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}


def sampling_options(greedy: bool = False, repetition_penalty: float | None = None, **sampling) -> dict:
    """generate() options from the command line's flags: no sampling flag (temperature, top_k, top_p,
    min_p) keeps the bundle's own generation defaults; any given samples with them; --greedy decodes
    greedily. A repetition penalty applies either way (HF applies it to greedy decoding too)."""
    given = {k: v for k, v in sampling.items() if v is not None}
    if greedy and given:
        raise InvalidInputError(
            f"--greedy cannot be combined with {', '.join('--' + k.replace('_', '-') for k in given)}"
        )
    penalty = {"repetition_penalty": repetition_penalty} if repetition_penalty is not None else {}
    options = check_options(given | penalty, vocab_size=1)
    if greedy:
        return {"do_sample": False} | options
    return options | ({"do_sample": True} if given else {})


def decides_decoding(options: dict) -> bool:
    """Whether command-line options say how to decode (sample or not), leaving nothing to defaults."""
    return "do_sample" in options


def turn_inputs(rt, system: str | None, prompt: str, images: list) -> dict:
    """One turn's model inputs: through the chat template, or for a base model without one, the plain
    text (system first)."""
    if not has_chat_template(rt):
        return prompt_inputs(rt, "\n\n".join(filter(None, [system, prompt])))
    return chat_inputs(rt, conversation(system, [user_message(prompt, images)]))


def run(config: RunConfig, out=None) -> dict:
    import torch

    from runtime.runtime import load

    out = out or sys.stdout
    if config.images and not read_manifest(config.bundle).is_multimodal:
        raise ImageInputError(f"--image given, but {config.bundle} is a text-only bundle; drop --image or export a VLM")
    images = open_images(config.images)  # a bad file fails before any loading
    start = time.perf_counter()
    rt = load(config.bundle, config.load)
    inputs = turn_inputs(rt, config.system, config.prompt, images)
    load_s = time.perf_counter() - start
    generator = torch.Generator(rt.contract.device).manual_seed(config.seed) if config.seed is not None else None
    start = time.perf_counter()
    stamps = []
    handle = rt.submit(
        **inputs,
        max_new_tokens=config.max_new_tokens,
        generator=generator,
        sampler="top-k" if generator is None else "hf",  # --seed: generate's own draws, as HF samples them
        **config.options,
    )
    for piece in _timed_text(rt.tokenizer, handle.tokens(), stamps):
        out.write(piece)
        out.flush()
    out.write("\n")  # the reply is a line of its own: a shell prompt or `>> file` starts after it
    prefill_ms = (stamps[0] - start) * 1e3
    decode_ms = (stamps[-1] - stamps[0]) * 1e3 / max(len(stamps) - 1, 1)
    mode = "sampled" if handle.request.config.do_sample else "greedy"
    print(
        f"[load {load_s:.2f} s | prefill {prefill_ms:.1f} ms, {inputs['input_ids'].shape[1]} tokens | decode "
        f"{decode_ms:.2f} ms/token ({1e3 / decode_ms if decode_ms else 0:.1f} tokens/s), {len(stamps)} tokens, {mode}]",
        file=sys.stderr,
    )
    return {"load_s": load_s, "prefill_ms": prefill_ms, "decode_ms_per_token": decode_ms, "new_tokens": len(stamps)}


def _timed_text(tokenizer, tokens, stamps: list):
    """stream_text over `tokens`, appending each token's arrival time to `stamps`."""

    def timed():
        for token in tokens:
            stamps.append(time.perf_counter())
            yield token

    yield from stream_text(tokenizer, timed())
