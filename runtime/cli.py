"""The runtime's commands: `run`, `inspect` and `verify`, as `python -m runtime ...` and inside `aotpack`.

Owns: their argument parsing at the edge. Each turns its arguments into a validated frozen config and
hands it to the library; errors of aotpack's own become one line on stderr and exit status 2. A
service that ships only `runtime/` keeps these commands: nothing here imports the exporter.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from runtime.errors import AotpackError


def add_commands(sub) -> dict:
    """Add run/inspect/verify to an argparse subparsers object; returns {command: handler}."""
    r = sub.add_parser("run", help="generate from a bundle, streaming to stdout")
    r.add_argument("bundle", type=Path)
    r.add_argument("--prompt", required=True)
    r.add_argument("--system")
    r.add_argument("--image", type=Path, action="append", default=[], help="image file; repeat for several")
    r.add_argument("--max-new-tokens", type=int, default=64)
    r.add_argument("--temperature", type=float)
    r.add_argument("--top-k", type=int)
    r.add_argument("--top-p", type=float)
    r.add_argument("--seed", type=int)
    r.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    sub.add_parser("inspect", help="print a bundle's manifest as a summary").add_argument("bundle", type=Path)
    v = sub.add_parser("verify", help="check a bundle without running it")
    v.add_argument("bundle", type=Path)
    v.add_argument("--key", type=Path, action="append", help="trusted public key (PEM): require a valid signature")
    _add_serve(sub)
    return {"run": _run, "inspect": _inspect, "verify": _verify, "serve": _serve}


def _add_serve(sub) -> None:
    s = sub.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server over a bundle (pip install 'aotpack[serve]')",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    s.add_argument("bundle", type=Path)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    s.add_argument("--max-queue", type=int, default=64, help="requests waiting for cache rows before 429")
    s.add_argument("--api-key", help="require `Authorization: Bearer KEY` (default: $AOTPACK_API_KEY, else none)")
    s.add_argument("--prefill-chunk", type=int, default=64, help="prefill long prompts in chunks of N tokens; 0: whole")
    s.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    s.add_argument("--max-body-bytes", type=int, default=16 * 2**20)
    s.add_argument("--max-image-pixels", type=int, default=16 * 2**20)
    s.add_argument("--shutdown-grace", type=float, default=30.0, help="seconds in-flight requests get after SIGTERM")
    s.add_argument("--model-name", help="the model id reported by /v1/models (default: the bundle's folder name)")


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
    from runtime.chat import RunConfig, run

    quiet()
    config = RunConfig(
        bundle=args.bundle, prompt=args.prompt, system=args.system, images=tuple(args.image),
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        seed=args.seed, threads=args.threads,
    )  # fmt: skip
    run(config)
    return 0


def _serve(args) -> int:
    try:
        from runtime.serve.server import serve
    except ImportError as e:
        raise AotpackError(
            f"aotpack serve needs its extra ({e.name} is missing): pip install 'aotpack[serve]'"
        ) from None
    from runtime.serve.config import ServeConfig

    quiet()
    config = ServeConfig(
        bundle=args.bundle, host=args.host, port=args.port, max_queue=args.max_queue,
        api_key=args.api_key if args.api_key is not None else os.environ.get("AOTPACK_API_KEY"),
        prefill_chunk=args.prefill_chunk or None, threads=args.threads, max_body_bytes=args.max_body_bytes,
        max_image_pixels=args.max_image_pixels, shutdown_grace=args.shutdown_grace, model_name=args.model_name,
    )  # fmt: skip
    serve(config)
    return 0


def _inspect(args) -> int:
    from runtime.bundle import bundle_file, read_manifest
    from runtime.summary import summary

    manifest = read_manifest(args.bundle)
    files = {name: bundle_file(args.bundle, name) for name in manifest.files}
    print(summary(manifest, {name: path.stat().st_size for name, path in files.items() if path.is_file()}))
    return 0


def _verify(args) -> int:
    from runtime.bundle import open_bundle

    _, manifest = open_bundle(args.bundle, trusted_keys=args.key)
    signed = f", signature verified with {len(args.key)} trusted key(s)" if args.key else ""
    print(f"{args.bundle}: OK ({len(manifest.files)} files verified{signed}, compatible with this machine)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime", description="Run and check aotpack bundles")
    handlers = add_commands(parser.add_subparsers(dest="command", required=True))
    return dispatch("aotpack", parser.parse_args(argv), handlers)
