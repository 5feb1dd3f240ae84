"""`aotpack bench --contexts 32,1024,4096 --max-cache-len 8192`: decode at each context, in one bundle.

Owns the context sweep and contexts.md / contexts.json: for each variant, one bundle of
`--max-cache-len` slots (and llama.cpp at the same n_ctx on the same weights), each system in a fresh
process per round decoding `--new-tokens` after a prompt of each context. What it shows is how a step's
cost grows with the context in use, against how llama.cpp's does; and, for aotpack, the engine's
per-token time against the compiled step called directly at the same span. A benchmark, not a test.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

from exporter.bench.build import export_variant, machine, measure, random_prompt
from exporter.bench.config import BenchConfig
from exporter.bench.llama_cpp import gguf_for, llama_cpp_available
from exporter.bench.report import attention_choice, attention_words, plain_llama_note, steal_note
from exporter.source import checkpoint_dir
from runtime.format.reader import read_manifest

SYSTEMS = ("aotpack", "llama_cpp")


def bench_contexts(config: BenchConfig, log=print) -> dict:
    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
    results = {"config": cfg, "machine": machine(), "runs": [], "builds": {}, "attention": {}}
    caches = (config.max_cache_len, *config.vs_caches)
    with tempfile.TemporaryDirectory(prefix="aotpack-bench-") as tmp, checkpoint_dir(config.model) as checkpoint:
        from transformers import AutoConfig

        vocab = min(AutoConfig.from_pretrained(checkpoint).get_text_config().vocab_size, 32000)
        prompt = random_prompt(vocab, max(config.contexts))
        for variant in config.variants:
            paths = _artifacts(config, variant, caches, checkpoint, Path(tmp), results, log)
            for round_ in range(config.rounds):  # rounds interleave every system and cache size
                for (system, cache), path in paths.items():
                    fits = [c for c in config.contexts if c + config.new_tokens <= cache]
                    log(f"[{variant}] round {round_ + 1}/{config.rounds}: {system}, {cache} slots, contexts {fits}")
                    extra = ("--contexts", ",".join(map(str, fits)))
                    sized = replace(config, max_cache_len=cache, contexts=tuple(fits), vs_caches=())
                    run = measure(system, path, variant, prompt, sized, Path(tmp) / f"r{round_}", extra)
                    results["runs"].append(run | {"round": round_, "cache": cache})
    write_contexts_report(results, config.out)
    return results


def _artifacts(config: BenchConfig, variant: str, caches, checkpoint: Path, tmp: Path, results: dict, log) -> dict:
    """{(system, cache size): its bundle or GGUF file}; llama.cpp runs one file at each n_ctx."""
    paths = {}
    gguf = None
    if config.llama_cpp_converter is not None and llama_cpp_available():
        log(f"[{variant}] converting the checkpoint to GGUF for llama.cpp")
        gguf = gguf_for(checkpoint, variant, config.llama_cpp_converter, tmp / "gguf")
    for cache in caches:
        bundle = tmp / f"bundle-{variant}-{cache}"
        log(f"[{variant}] exporting the bundle ({cache} slots)")
        results["builds"][f"{variant}-{cache}"] = export_variant(checkpoint, bundle, variant, cache, config.gemv)
        results["attention"][f"{variant}-{cache}"] = attention_choice(read_manifest(bundle))
        paths[("aotpack", cache)] = bundle
        if gguf is not None:
            paths[("llama_cpp", cache)] = gguf
    return paths


def figures(results: dict) -> list[dict]:
    """Per (variant, system, context): medians over rounds of decode ms/token, its slowdown against the
    shortest context, and for aotpack the engine's time over the step called directly."""
    rows = []
    keys = {(r["dtype"], r["system"], r["cache"]) for r in results["runs"]}
    for variant, system, cache in sorted(keys, key=lambda k: (k[0], SYSTEMS.index(k[1]), -k[2])):
        runs = [
            r["contexts"] for r in results["runs"] if (r["dtype"], r["system"], r["cache"]) == (variant, system, cache)
        ]
        contexts = list(runs[0])
        decode = {c: statistics.median(r[c]["decode_ms_per_token"] for r in runs) for c in contexts}
        for c in contexts:
            row = {"variant": variant, "system": system, "cache": cache, "context": int(c), "decode_ms": decode[c]}
            row["slowdown"] = decode[c] / decode[contexts[0]]
            row["prefill_ms"] = statistics.median(r[c]["prefill_ms"] for r in runs)
            if "step_direct_ms" in runs[0][c]:
                row["engine_over_step"] = decode[c] / statistics.median(r[c]["step_direct_ms"] for r in runs)
            rows.append(row)
    return rows


def markdown(results: dict) -> str:
    cfg, m, rows = results["config"], results["machine"], figures(results)
    lines = [
        f"`aotpack bench --model {cfg['model']} --contexts {','.join(map(str, cfg['contexts']))} --max-cache-len "
        f"{cfg['max_cache_len']}{''.join(f' --vs-cache {c}' for c in cfg['vs_caches'])} --rounds {cfg['rounds']}`: "
        f"per variant a bundle of each cache size (llama.cpp at that n_ctx), {cfg['new_tokens']} new tokens after a "
        f"prompt of each context that fits, greedy, batch 1, {cfg['threads']} threads; {m['cpu']} "
        f"({', '.join(m['isa'])}). Medians over {cfg['rounds']} fresh-process round(s), interleaved.",
        "",
        "| variant | system | cache | context | prefill | decode | vs shortest context | engine ÷ step alone |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r['engine_over_step']:.2f}×" if "engine_over_step" in r else ""
        lines.append(
            f"| {r['variant']} | {r['system']} | {r['cache']} | {r['context']} | {r['prefill_ms']:.0f} ms | "
            f"{r['decode_ms']:.1f} ms/tok | {r['slowdown']:.2f}× | {ratio} |"
        )
    runs = results["runs"]
    notes = [*_attention_note(results), *_verdicts(rows), *plain_llama_note(runs), *steal_note(runs)]
    return "\n".join(lines + ["", *notes]) + "\n"


def _attention_note(results: dict) -> list[str]:
    """Which decode attention each bundle's export chose (reports before it was recorded have none)."""
    chosen = sorted((results.get("attention") or {}).items())
    own = "the model's own attention"
    return [f"- the {bundle} bundle: {attention_words(c) or own}" for bundle, c in chosen]


def _verdicts(rows: list[dict]) -> list[str]:
    """In the largest cache, aotpack's slowdown at the longest context against llama.cpp's, per variant;
    and what a larger cache costs at the shortest context."""
    out, largest = [], max(r["cache"] for r in rows)
    for variant in sorted({r["variant"] for r in rows}):
        last = {r["system"]: r for r in rows if r["variant"] == variant and r["cache"] == largest}  # longest wins
        if {"aotpack", "llama_cpp"} <= set(last):
            a, b = last["aotpack"], last["llama_cpp"]
            out.append(
                f"- {variant}: at {a['context']} tokens aotpack decodes {a['slowdown']:.2f}× slower than at the "
                f"shortest context, llama.cpp {b['slowdown']:.2f}× (ratio {a['slowdown'] / b['slowdown']:.2f}); "
                f"aotpack {a['decode_ms']:.1f} against llama.cpp {b['decode_ms']:.1f} ms/tok there "
                f"({b['decode_ms'] / a['decode_ms']:.2f}× llama.cpp's speed)"
            )
        out += _cache_costs([r for r in rows if r["variant"] == variant])
    return out


def _cache_costs(rows: list[dict]) -> list[str]:
    """Per system: decode at the shortest context in the largest bundle against the smallest."""
    out = []
    for system in SYSTEMS:
        mine = [r for r in rows if r["system"] == system and r["context"] == min(x["context"] for x in rows)]
        if len(mine) > 1:
            big, small = max(mine, key=lambda r: r["cache"]), min(mine, key=lambda r: r["cache"])
            out.append(
                f"- {big['variant']}, {system}: at {big['context']} tokens of context, a {big['cache']}-slot cache "
                f"decodes at {big['decode_ms'] / small['decode_ms']:.2f}× a {small['cache']}-slot one's ms/tok"
            )
    return out


def write_contexts_report(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "contexts.json").write_text(json.dumps(results | {"figures": figures(results)}, indent=2))
    (out / "contexts.md").write_text(markdown(results))
