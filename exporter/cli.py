"""The `aotpack` command: export, run, inspect, verify.

Owns: argument parsing at the edge. Each subcommand turns its arguments into a validated frozen
config and hands it to the library; errors of aotpack's own become one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from runtime.errors import AotpackError

DEFAULT_PRESET = "tiny-gemma3-vlm"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aotpack", description="Ahead-of-time packager for HF language and vision-language models")
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="export a checkpoint's decode step into a bundle")
    e.add_argument("model", help="checkpoint directory, hub id already in the local cache, or preset name")
    e.add_argument("--out", type=Path, help="bundle directory (default: artifacts/<name>)")
    e.add_argument("--max-cache-len", type=int, default=2048)
    e.add_argument("--batch-size", type=int, default=1, help="largest batch the bundle serves")
    e.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    e.add_argument("--device", default="cpu", help="cpu or cuda")
    e.add_argument("--cpu-isa", default="native", help="native (this CPU) or avx2 (portable x86-64)")
    e.add_argument("--force", action="store_true", help="replace an existing bundle once the new one is complete")
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
    b = sub.add_parser("bench", help="benchmark HF eager, HF + torch.compile and aotpack (a benchmark, not a test)")
    b.add_argument("--model", default="gemma3-270m-arch", help="preset or checkpoint directory")
    b.add_argument("--dtype", action="append", dest="dtypes", help="repeat for several (default: float32 and bfloat16)")
    b.add_argument("--prompt-len", type=int, default=32)
    b.add_argument("--new-tokens", type=int, default=64)
    b.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    b.add_argument("--out", type=Path, default=Path("artifacts/bench"))
    b.add_argument("--rounds", type=int, default=1, help="fresh-process runs per system; figures are medians over rounds")
    for name, text in (("inspect", "print a bundle's manifest as a summary"), ("verify", "check a bundle without running it")):
        sub.add_parser(name, help=text).add_argument("bundle", type=Path)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        commands = {"export": _export, "run": _run, "inspect": _inspect, "verify": _verify, "bench": _bench}
        return commands[args.command](args)
    except AotpackError as e:
        print(f"aotpack {args.command}: error: {e}", file=sys.stderr)
        return 2


def _quiet() -> None:
    """Progress bars and library deprecation chatter drown the command's own output."""
    import warnings

    from transformers.utils import logging

    logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)


def _export(args) -> int:
    from exporter.config import ExportConfig
    from exporter.export import export

    _quiet()
    out = args.out or Path("artifacts") / Path(args.model).name
    config = ExportConfig(
        model=args.model, out=out, max_cache_len=args.max_cache_len, batch_size=args.batch_size, dtype=args.dtype,
        device=args.device, force=args.force, cpu_isa=args.cpu_isa,
    )
    manifest = export(config, log=lambda msg: print(f"[aotpack] {msg}", file=sys.stderr, flush=True))
    p = manifest.parity
    print(f"wrote {out} in {manifest.build_seconds:.0f} s; parity max |Δlogit| {p.max_abs_logit_diff:.2e}, tokens match: {p.tokens_match}")
    return 0


def _run(args) -> int:
    from runtime.chat import RunConfig, run

    _quiet()
    config = RunConfig(
        bundle=args.bundle, prompt=args.prompt, system=args.system, images=tuple(args.image),
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        seed=args.seed, threads=args.threads,
    )
    run(config)
    return 0


def _bench(args) -> int:
    from exporter.bench import BenchConfig, bench

    config = BenchConfig(
        model=args.model, dtypes=tuple(args.dtypes or ("float32", "bfloat16")), prompt_len=args.prompt_len,
        new_tokens=args.new_tokens, threads=args.threads, out=args.out, rounds=args.rounds,
    )
    bench(config, log=lambda msg: print(f"[bench] {msg}", file=sys.stderr, flush=True))
    print((config.out / "bench.md").read_text())
    return 0


def _inspect(args) -> int:
    from runtime.bundle import bundle_file, read_manifest
    from runtime.summary import summary

    manifest = read_manifest(args.bundle)
    sizes = {n: bundle_file(args.bundle, n).stat().st_size for n in manifest.files if bundle_file(args.bundle, n).is_file()}
    print(summary(manifest, sizes))
    return 0


def _verify(args) -> int:
    from runtime.bundle import open_bundle

    _, manifest = open_bundle(args.bundle)
    print(f"{args.bundle}: OK ({len(manifest.files)} files verified, compatible with this machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
