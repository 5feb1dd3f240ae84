"""The runtime's commands: `run`, `chat`, `inspect`, `verify` and `serve`, as `python -m runtime ...` and
inside `aotpack`.

Owns: their argument parsing at the edge. Each turns its arguments into a validated frozen config
(the load options into one runtime.config.LoadConfig) and hands it to the library (`run`: runtime.cli
.run; `chat`: runtime.cli.chat; `serve`: runtime.serve); errors of aotpack's own become one line on
stderr and exit status 2. A service that ships only `runtime/` keeps these commands: nothing here
imports the exporter, and `--help`, `inspect` and `verify`'s checks of hashes and signatures import no
torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from runtime import backends
from runtime.errors import AotpackError
from runtime.serve.config import PREFILL_BUDGET, PREFILL_CHUNK


class Formatter(argparse.HelpFormatter):
    """--help shows each option's default, where it has one worth showing."""

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        if action.default in (None, False, [], argparse.SUPPRESS) or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def add_commands(sub) -> dict:
    """Add run/chat/inspect/verify/serve to an argparse subparsers object; returns {command: handler}."""
    r = sub.add_parser("run", help="generate one reply from a bundle, streaming to stdout", formatter_class=Formatter)
    r.add_argument("bundle", type=Path)
    r.add_argument("--prompt", required=True, help="the user message")
    r.add_argument("--system", help="system prompt")
    r.add_argument("--image", type=Path, action="append", default=[], help="image file; repeat for several")
    r.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate at most")
    _add_sampling(r)
    r.add_argument("--seed", type=int, help="seed of the sampling generator")
    _add_load(r)
    _add_chat(sub)
    sub.add_parser("inspect", help="print a bundle's manifest as a summary").add_argument("bundle", type=Path)
    v = sub.add_parser("verify", help="check a bundle without running it", formatter_class=Formatter)
    v.add_argument("bundle", type=Path)
    v.add_argument("--key", type=Path, action="append", help="trusted public key (PEM): require a valid signature")
    v.add_argument(
        "--backend", choices=backends.names(), default=backends.DEFAULT, help="check compatibility for this decode"
    )
    _add_serve(sub)
    return {"run": _run, "chat": _chat, "inspect": _inspect, "verify": _verify, "serve": _serve}


def _add_sampling(p) -> None:
    p.add_argument("--temperature", type=float, help="sample with this temperature (default: the bundle's defaults)")
    p.add_argument("--top-k", type=int, help="sample from the k most likely tokens")
    p.add_argument("--top-p", type=float, help="sample from the smallest set of tokens with this probability")
    p.add_argument("--min-p", type=float, help="drop tokens less likely than this fraction of the most likely one")
    p.add_argument(
        "--repetition-penalty", type=float, help="divide the scores of tokens already seen by this (HF's; 1: none)"
    )
    p.add_argument("--greedy", action="store_true", help="decode greedily, whatever the bundle's defaults say")


def _add_load(p) -> None:
    """The load options every command that loads a bundle takes (runtime.config.LoadConfig)."""
    p.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    summaries = "; ".join(f"{e.name}: {e.summary}" for e in backends.REGISTRY)
    p.add_argument(
        "--backend", choices=backends.names(), default=backends.DEFAULT, help=f"decode backend ({summaries})"
    )
    p.add_argument("--prepack", action="store_true", help="onnxruntime: prepack the weights (faster, a second copy)")
    p.add_argument(
        "--no-speculation",
        action="store_true",
        help="never draft tokens (default: a bundle exported with --speculate drafts by prompt lookup for greedy "
        "requests when it pays, and for sampled ones that ask with prompt_lookup_num_tokens)",
    )
    p.add_argument(
        "--key", type=Path, action="append", help="trusted public key (PEM): load only a bundle it signed; repeat"
    )


def load_config(args, **extra):
    from runtime.config import LoadConfig

    return LoadConfig(
        num_threads=args.threads, backend=args.backend, prepack=args.prepack, trusted_keys=args.key,
        speculation=not args.no_speculation, **extra,
    )  # fmt: skip


def _add_chat(sub) -> None:
    c = sub.add_parser(
        "chat", help="interactive chat on a bundle, keeping the cache between turns", formatter_class=Formatter
    )
    c.add_argument("bundle", type=Path)
    c.add_argument("--system", help="system prompt")
    c.add_argument("--image", type=Path, action="append", default=[], help="image for the first message (VLMs)")
    c.add_argument("--max-new-tokens", type=int, default=256, help="per reply")
    _add_sampling(c)
    c.add_argument("--drop-oldest", action="store_true", help="when the cache fills, drop the oldest turns")
    _add_load(c)


def _add_serve(sub) -> None:
    s = sub.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server over a bundle (pip install 'aotpack[serve]')",
        formatter_class=Formatter,
    )
    s.add_argument("bundle", type=Path)
    s.add_argument("--host", default="127.0.0.1", help="address to listen on")
    s.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    s.add_argument("--max-queue", type=int, default=64, help="requests waiting for cache rows before 429")
    s.add_argument("--api-key", help="require `Authorization: Bearer KEY` (default: $AOTPACK_API_KEY, else none)")
    s.add_argument(
        "--prefill-chunk", type=int, default=PREFILL_CHUNK, help="prefill long prompts in chunks of N tokens; 0: whole"
    )
    s.add_argument(
        "--prefill-budget",
        type=float,
        help="size each chunk (at most --prefill-chunk tokens) to take about this many decode steps' time, as "
        f"measured while serving (default {PREFILL_BUDGET:g}); 0: every chunk --prefill-chunk tokens",
    )
    s.add_argument(
        "--no-prefix-cache",
        action="store_true",
        help="prefill every prompt whole (default: a finished request's row keeps its tokens, and a prompt "
        "starting the same way prefills only the rest)",
    )
    s.add_argument("--max-body-bytes", type=int, default=16 * 2**20, help="larger request bodies get 413")
    s.add_argument("--max-image-pixels", type=int, default=16 * 2**20, help="larger images are refused")
    s.add_argument(
        "--max-request-pixels", type=int, default=32 * 2**20, help="all images of one request together, at most"
    )
    s.add_argument("--max-images", type=int, default=8, help="images per request, at most")
    s.add_argument("--max-stops", type=int, default=4, help="stop strings per request, at most")
    s.add_argument("--max-stop-chars", type=int, default=1024, help="characters per stop string, at most")
    s.add_argument(
        "--parse-special",
        action="store_true",
        help="control-token strings in message content act as control tokens (default: they stay text, so a "
        "user cannot open a turn of another role)",
    )
    s.add_argument("--shutdown-grace", type=float, default=30.0, help="seconds in-flight requests get after SIGTERM")
    s.add_argument(
        "--served-model-name",
        "--model-name",
        nargs="+",
        metavar="NAME",
        dest="served_model_names",
        help="the model ids requests may name, the first reported by /v1/models; any other gets a 404 "
        "(default: the bundle's folder name)",
    )
    _add_load(s)
    r = s.add_argument_group("scale-out on Ray Serve (pip install 'aotpack[ray]')")
    r.add_argument("--ray", action="store_true", help="serve replicas of the bundle through Ray Serve's HTTP proxy")
    r.add_argument("--replicas", type=int, help="a fixed number of replicas (default 1)")
    r.add_argument("--min-replicas", type=int, help="autoscale on ongoing requests per replica, down to A")
    r.add_argument("--max-replicas", type=int, help="... and up to B")
    r.add_argument("--ray-address", help="join this Ray cluster ('auto', 'ray://HEAD:10001'); default: a local one")
    r.add_argument(
        "--ray-label", action="append", metavar="KEY=VALUE", help="place replicas only on nodes with this label; repeat"
    )


def dispatch(prog: str, args, handlers: dict) -> int:
    """Run one command; aotpack's own errors, a closed output pipe (`| head`) and Ctrl-C end it with one
    line on stderr and exit status 2, never a traceback."""
    try:
        return handlers[args.command](args)
    except AotpackError as e:
        message = str(e)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more can be written there
        message = "the output was closed before the command finished"
    except KeyboardInterrupt:
        message = "interrupted"
    print(f"{prog} {args.command}: error: {message}", file=sys.stderr)
    return 2


def quiet() -> None:
    """Progress bars and library deprecation chatter drown the command's own output."""
    import warnings

    from transformers.utils import logging

    logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)


def _run(args) -> int:
    from runtime.cli.run import RunConfig, run

    quiet()
    config = RunConfig(
        bundle=args.bundle, prompt=args.prompt, system=args.system, images=tuple(args.image),
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        min_p=args.min_p, repetition_penalty=args.repetition_penalty, greedy=args.greedy, seed=args.seed,
        load=load_config(args),
    )  # fmt: skip
    run(config)
    return 0


def _chat(args) -> int:
    from runtime.cli.chat import ChatConfig, chat
    from runtime.cli.run import sampling_options

    quiet()
    config = ChatConfig(
        bundle=args.bundle, system=args.system, images=tuple(args.image), max_new_tokens=args.max_new_tokens,
        sampling=sampling_options(
            greedy=args.greedy, repetition_penalty=args.repetition_penalty, temperature=args.temperature,
            top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        ),
        drop_oldest=args.drop_oldest, load=load_config(args),
    )  # fmt: skip
    return chat(config)


def _serve(args) -> int:
    try:
        from runtime.serve.server import serve
    except ImportError as e:
        raise AotpackError(
            f"aotpack serve needs its extra ({e.name} is missing): pip install 'aotpack[serve]'"
        ) from None
    from runtime.serve.config import ServeConfig

    ray = _ray_config(args)

    quiet()
    config = ServeConfig(
        bundle=args.bundle, host=args.host, port=args.port, max_queue=args.max_queue,
        api_key=args.api_key if args.api_key is not None else os.environ.get("AOTPACK_API_KEY"),
        max_body_bytes=args.max_body_bytes, max_image_pixels=args.max_image_pixels,
        max_request_pixels=args.max_request_pixels, max_images=args.max_images, parse_special=args.parse_special,
        max_stops=args.max_stops, max_stop_chars=args.max_stop_chars,
        shutdown_grace=args.shutdown_grace, served_model_names=tuple(args.served_model_names or ()),
        load=load_config(
            args, **_prefill_options(args.prefill_chunk, args.prefill_budget), prefix_cache=not args.no_prefix_cache
        ),
    )  # fmt: skip
    if ray is None:
        serve(config)
    else:
        _serve_ray(config, ray)
    return 0


def _prefill_options(chunk: int, budget: float | None) -> dict:
    """serve's --prefill-chunk (0: whole prompts) and --prefill-budget (0: fixed chunks; None: the default
    budget when chunking) as LoadConfig's fields, refused by flag name here."""
    if chunk < 0:
        raise AotpackError(f"--prefill-chunk must be a number of tokens >= 0 (0: whole prompts), got {chunk}")
    if budget is not None and not budget >= 0:  # NaN too
        raise AotpackError(f"--prefill-budget must be a number of decode steps >= 0 (0: fixed chunks), got {budget}")
    if chunk == 0 and budget:
        raise AotpackError(
            f"--prefill-budget {budget:g} sizes prefill chunks, and --prefill-chunk 0 prefills whole prompts; "
            "give --prefill-chunk the largest chunk (e.g. 64), or drop --prefill-budget"
        )
    budget = PREFILL_BUDGET if budget is None else budget
    return {"prefill_chunk": chunk or None, "prefill_budget": (budget or None) if chunk else None}


def _ray_config(args):
    from runtime.serve.config import RayConfig

    ray = {"replicas": args.replicas, "min_replicas": args.min_replicas, "max_replicas": args.max_replicas}
    ray |= {"address": args.ray_address, "labels": tuple(args.ray_label) if args.ray_label else None}
    given = [f"--{name.replace('_', '-')}" for name, value in ray.items() if value is not None]
    if given and not args.ray:
        raise AotpackError(f"{', '.join(given)} scale out on Ray Serve: add --ray")
    if args.ray and args.max_queue == 0:  # it used to mean "unbounded" there, and "never wait" without Ray
        raise AotpackError(
            "--max-queue 0 (no request waits) has no Ray Serve equivalent: its proxy's queue takes a bound of "
            "1 or more; give --max-queue 1 or more with --ray"
        )
    return RayConfig(**{name: value for name, value in ray.items() if value is not None}) if args.ray else None


def _serve_ray(config, ray_config) -> None:
    try:
        import ray.serve  # noqa: F401
    except ImportError as e:
        message = f"aotpack serve --ray needs its extra ({e.name} is missing): pip install 'aotpack[ray]'"
        raise AotpackError(message) from None
    from runtime.serve.cluster import serve_ray

    serve_ray(config, ray_config)


def _inspect(args) -> int:
    from runtime.format.files import GENERATION
    from runtime.format.reader import bundle_file, read_manifest
    from runtime.format.summary import summary

    manifest = read_manifest(args.bundle)
    files = {name: bundle_file(args.bundle, name) for name in manifest.files}
    sizes = {name: path.stat().st_size for name, path in files.items() if path.is_file()}
    print(summary(manifest, sizes, _generation(files.get(GENERATION))))
    return 0


def _generation(path) -> dict | None:
    """The bundle's generation defaults as its file says (hashes are `verify`'s and load()'s to check)."""
    if path is None or not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _verify(args) -> int:
    """Hashes and signature (torch-free), then the backend's compatibility with this machine, which needs
    the backend's own imports: where they are missing (no torch here), that part is said to be unchecked."""
    from runtime.format.reader import open_bundle

    try:
        backend, unchecked = backends.backend(args.backend), None
    except ImportError as e:
        backend, unchecked = None, e.name
    _, manifest = open_bundle(args.bundle, backend)
    verified_by = None
    if args.key:
        from runtime.format.signing import verify  # model-signing is an optional extra

        verified_by = verify(args.bundle, args.key)  # the key that verified it, not merely one of those given
    signed = f", signature verified with trusted key {str(verified_by)!r}" if verified_by else ""
    fits = (
        f"its {args.backend} decode is compatible with this machine"
        if unchecked is None
        else f"the {args.backend} decode's compatibility was not checked: {unchecked} is not installed"
    )
    print(f"{args.bundle}: OK ({len(manifest.files)} files verified{signed}, {fits})")
    return 0


def add_version(parser) -> None:
    """`--version` without importing torch: the installed packages' metadata says."""
    from importlib.metadata import PackageNotFoundError, version

    from runtime.version import AOTPACK_VERSION

    try:
        deps = f"torch {version('torch')}, transformers {version('transformers')}"
    except PackageNotFoundError:
        deps = "torch or transformers not installed"
    parser.add_argument("--version", action="version", version=f"aotpack {AOTPACK_VERSION} ({deps})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime", description="Run and check aotpack bundles")
    add_version(parser)
    handlers = add_commands(parser.add_subparsers(dest="command", required=True))
    return dispatch("aotpack", parser.parse_args(argv), handlers)
