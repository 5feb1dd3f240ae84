"""`aotpack chat`: an interactive terminal chat over one session (runtime.session).

Owns: the read-reply loop: readline history, the slash commands, streaming each reply as it is
generated, per-turn timings, and the keys: Ctrl-C stops the current reply (the conversation keeps
what was shown), Ctrl-C at the prompt clears the line, Ctrl-D exits.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from runtime.cli.run import CHAT_DEFAULTS, decides_decoding
from runtime.config import LoadConfig
from runtime.errors import AotpackError, InvalidInputError
from runtime.inputs import open_images
from runtime.text import TextPieces

HELP = "/reset clears the conversation, /exit"
IMAGE_HELP = "/image PATH attaches an image to your next message"


def _help(rt) -> str:
    """The commands this bundle takes: /image only where it takes images."""
    return HELP.replace(", /exit", f", {IMAGE_HELP}, /exit") if rt.is_multimodal else HELP


def turn_sampling(flags: dict, defaults) -> tuple[dict, str]:
    """The options every turn decodes with, and the line saying which: the command line's if they say
    how to decode, else the bundle's sampling defaults (its generation_config), else CHAT_DEFAULTS."""
    if decides_decoding(flags):
        how = "greedy" if not flags["do_sample"] else f"sampling with {_settings(flags)}"
        return flags, f"decoding: {how} (from the command line)"
    if defaults.do_sample:
        bundle = {k: getattr(defaults, k, None) for k in CHAT_DEFAULTS if k != "do_sample"}
        return flags, f"decoding: sampling with the bundle's defaults ({_settings(bundle | flags)})"
    chosen = CHAT_DEFAULTS | flags
    return chosen, (
        f"decoding: sampling with {_settings(chosen)}, llama.cpp's defaults (the bundle has none of its own; "
        "--greedy decodes greedily, --temperature etc. set them)"
    )


def _settings(options: dict) -> str:
    shown = {k: v for k, v in options.items() if k != "do_sample" and v is not None}
    return ", ".join(f"{k.replace('_', '-')} {v:g}" for k, v in shown.items()) or "no warper"


@dataclass(frozen=True)
class ChatConfig:
    bundle: Path
    system: str | None = None
    images: tuple[Path, ...] = ()  # attached to the first message
    max_new_tokens: int = 256
    sampling: dict | None = None  # generate() options from the command line (runtime.cli.run.sampling_options)
    drop_oldest: bool = False
    load: LoadConfig = field(default_factory=LoadConfig)
    history: Path | None = Path("~/.aotpack_history")  # readline history; None keeps none


class _Printer:
    """A streamer (put/end, as generate feeds one) that prints each token's text as it comes, not a
    word at a time as transformers' TextStreamer does, and notes when the first token came."""

    def __init__(self, tokenizer, out):
        self.pieces, self.out = TextPieces(tokenizer), out
        self.prompt_seen, self.first = False, None

    def put(self, value) -> None:
        if not self.prompt_seen:  # generate hands the prompt first
            self.prompt_seen = True
            return
        self.first = self.first or time.perf_counter()
        self._write(self.pieces.add(int(value.reshape(-1)[0])))

    def end(self) -> None:
        self._write(self.pieces.finish() + "\n")

    def _write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()


def chat(config: ChatConfig, out=sys.stdout) -> int:
    from runtime.runtime import load

    images = open_images(config.images)  # a bad file fails before any loading
    start = time.perf_counter()
    rt = load(config.bundle, config.load)
    rt.processor  # noqa: B018 (loaded now: the first turn should not pay for it)
    if images and not rt.is_multimodal:
        raise InvalidInputError(f"--image given, but {config.bundle} is a text-only bundle")
    m = rt.manifest
    sampling, decoding = turn_sampling(config.sampling or {}, rt.generation_config)
    print(
        f"aotpack chat: {config.bundle} ({m.model_class}, {m.dtype}), ready in {time.perf_counter() - start:.1f} s",
        file=out,
    )
    print(decoding, file=out)
    print(f"{_help(rt)}; Ctrl-C stops a reply, Ctrl-D exits.", file=out, flush=True)
    config = replace(config, sampling=sampling)
    history = _readline(config.history)
    with rt.session(system=config.system, drop_oldest=config.drop_oldest, sampler="top-k") as session:
        while True:
            try:  # Ctrl-C while typing (or between turns) clears the line; during a reply _turn stops it
                line = _read()
                if line is None or line in ("/exit", "/quit"):
                    break
                if line.startswith("/"):
                    images = _command(line, session, rt, images, out)
                elif line:
                    _turn(rt, session, line, images, config, out)
                    images = []
            except KeyboardInterrupt:
                print("^C", file=out, flush=True)
    history()
    return 0


def _read() -> str | None:
    """The next line, stripped; None at Ctrl-D."""
    try:
        return input("> ").strip()
    except EOFError:
        print()
        return None


def _command(line: str, session, rt, images: list, out) -> list:
    name, _, argument = line.partition(" ")
    if name == "/reset":
        session.reset()
        print("(conversation cleared)", file=out)
    elif name == "/image":
        if not rt.is_multimodal:
            print("this bundle is text-only: it takes no images", file=out)
        else:
            try:
                images = images + open_images([Path(argument.strip()).expanduser()])
                print(f"({len(images)} image(s) attached to your next message)", file=out)
            except AotpackError as e:
                print(f"error: {e}", file=out)
    else:
        print(_help(rt), file=out)
    return images


def _turn(rt, session, line: str, images: list, config: ChatConfig, out) -> None:
    printer = _Printer(rt.tokenizer, out)
    start, stopped = time.perf_counter(), False
    options = (config.sampling or {}) | {"max_new_tokens": config.max_new_tokens}
    try:
        session.send(line, images=images, streamer=printer, **options)
    except KeyboardInterrupt:
        stopped = True
    except AotpackError as e:
        print(f"error: {e}", file=out, flush=True)
        return
    _timings(session.last, start, printer.first, stopped, out)


def _timings(turn, start: float, first: float | None, stopped: bool, out) -> None:
    end = time.perf_counter()
    if turn is None:
        return
    rate = (turn.new_tokens - 1) / (end - first) if first and turn.new_tokens > 1 and end > first else 0.0
    ttft = f"{(first - start) * 1e3:.0f} ms to first token, " if first else ""
    dropped = f", {turn.dropped_turns} oldest turn(s) dropped" if turn.dropped_turns else ""
    print(
        f"[{'stopped, ' if stopped else ''}{turn.reused} tokens from the cache, {turn.prefilled} prefilled, "
        f"{ttft}{turn.new_tokens} tokens at {rate:.1f} tokens/s{dropped}]",
        file=out,
        flush=True,
    )


def _readline(path: Path | None):
    """Line editing and history where the readline module exists; returns the function that saves it."""
    try:
        import readline
    except ImportError:
        return lambda: None
    if path is None:
        return lambda: None
    path = path.expanduser()
    try:
        readline.read_history_file(path)
    except OSError:
        pass

    def save():
        try:
            readline.write_history_file(path)
        except OSError:
            pass

    return save
