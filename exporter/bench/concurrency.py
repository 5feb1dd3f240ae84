"""`aotpack bench --streams N`: the continuous-batching benchmark and its report.

Owns: building a bundle with N cache rows, running exporter.bench.streams on it in a fresh process,
and streams.json / streams.md with a verdict per target of the continuous-batching issue:
- aggregate tokens/s with N streams >= 5x one stream's;
- p50 inter-token latency with N streams <= 1.6x one stream's;
- p99 inter-token latency of N - 1 streams while a long prompt is admitted in chunks < 3x their p50,
  with chunks sized to a time budget as `aotpack serve` sizes them (the same admission with the prompt
  prefilled whole, and in chunks of a fixed token count, is reported beside it).
This is a benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from exporter.bench.build import chunk_graph, export_variant, header, run
from exporter.bench.config import BenchConfig
from exporter.bench.report import attention_words, verdict_of
from exporter.source import checkpoint_dir

# (label, figure, bound): figures come from `figures()`
TARGETS = (
    ("aggregate tokens/s at N streams ≥ 5× one stream's", "throughput_gain", (">=", 5.0)),
    ("p50 inter-token latency at N streams ≤ 1.6× one stream's", "itl_growth", ("<=", 1.6)),
    (
        "p99 ITL while a long prompt is admitted in chunks < 3× p50 (the median admission)",
        "budgeted_p99_over_p50",
        ("<", 3.0),
    ),
    ("(not a target) the same, chunks of a fixed token count", "chunked_p99_over_p50", (None, None)),
    ("(not a target) the same, prompt prefilled whole", "whole_p99_over_p50", (None, None)),
)


def bench_streams(config: BenchConfig, log=print) -> dict:
    """The bundle has a service's cache (--max-cache-len, 2,048 by default), and the default graphs:
    one per power of two up to N rows."""
    variant = config.variants[0]
    cache = max(config.max_cache_len, config.long_prompt + 8, config.prompt_len + 4 * config.new_tokens + 8)
    with tempfile.TemporaryDirectory(prefix="aotpack-streams-") as tmp, checkpoint_dir(config.model) as checkpoint:
        bundle = Path(tmp) / "bundle"
        log(f"[{variant}] exporting a bundle with {config.streams} cache rows, max_cache_len {cache}")
        build_s = export_variant(
            checkpoint, bundle, variant, cache, config.gemv, batch=config.streams, extra=chunk_graph(config)
        )
        log(f"[{variant}] 1 stream, {config.streams} streams, then a {config.long_prompt}-token prompt admitted")
        measured = json.loads(run([sys.executable, "-m", "exporter.bench.streams", *_worker_args(config, bundle)]))
    results = header(config) | {
        "build_s": build_s,
        "variant": variant,
        "measured": measured,
    }
    write_streams_report(results, config.out)
    return results


def _worker_args(config: BenchConfig, bundle: Path) -> list[str]:
    options = {
        "--path": bundle,
        "--streams": config.streams,
        "--prompt-len": config.prompt_len,
        "--new-tokens": config.new_tokens,
        "--long-prompt": config.long_prompt,
        "--chunk": config.prefill_chunk,
        "--budget": config.prefill_budget,
        "--threads": config.threads,
    }
    return [str(x) for pair in options.items() for x in pair]


def figures(measured: dict) -> dict:
    one, many = measured["one"], measured["many"]
    whole, chunked, budgeted = measured["admission"]
    return {
        "throughput_gain": many["tokens_per_s"] / one["tokens_per_s"],
        "itl_growth": many["itl_p50_ms"] / one["itl_p50_ms"],
        "budgeted_p99_over_p50": budgeted["p99_over_p50"],
        "chunked_p99_over_p50": chunked["p99_over_p50"],
        "whole_p99_over_p50": whole["p99_over_p50"],
    }


def markdown(results: dict) -> str:
    m, f = results["measured"], figures(results["measured"])
    one, many = m["one"], m["many"]
    cfg, machine_ = results["config"], results["machine"]
    lines = [
        f"# aotpack continuous batching: {cfg['model']}, {results['variant']}",
        "",
        f"{machine_['cpu']} ({', '.join(machine_['isa'])}), {cfg['threads']} threads, torch {machine_['torch']}; "
        f"bundle with {m['rows']} cache rows{_attention(m)} built in {results['build_s']:.0f} s; "
        f"prompts of {cfg['prompt_len']} "
        f"tokens, {cfg['new_tokens']} new tokens each. Token times are the engine's own.",
        "",
        f"Each decode graph called directly, all its rows at context {cfg['prompt_len'] + cfg['new_tokens'] // 2} "
        f"of a {m['max_cache_len']}-slot cache:",
        "",
        "| graph (rows) | step (ms) | ms per row | step ÷ batch-1 step |",
        "|---|---|---|---|",
        *(_graph_row(g, m["graphs"][0]["step_ms"]) for g in m["graphs"]),
        "",
        "| streams | aggregate tokens/s | ITL p50 (ms) | ITL p99 (ms) |",
        "|---|---|---|---|",
        *(
            f"| {r['streams']} | {r['tokens_per_s']:.1f} | {r['itl_p50_ms']:.1f} | {r['itl_p99_ms']:.1f} |"
            for r in (one, many)
        ),
        "",
        *_rounds(m),
        f"{m['rows'] - 1} streams decoding while a {m['admission'][0]['long_prompt_tokens']}-token prompt arrives "
        "(each way a few times, a different prompt each: the admission with the median p99 / p50, and every one's):",
        "",
        "| prefill | ITL p50 before (ms) | ITL p99 during (ms) | longest stall (ms) | p99 / p50 "
        "| its first token (s) | p99 / p50 of each |",
        "|---|---|---|---|---|---|---|",
        *(_admission_row(a) for a in m["admission"]),
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        *(f"| {label} | {f[key]:.2f}× | {verdict_of(f[key], bound)} |" for label, key, bound in TARGETS),
    ]
    return "\n".join(lines) + "\n"


def _attention(m: dict) -> str:
    words = attention_words(m.get("decode_attention"))
    return f" and {words}" if words else ""


def _rounds(m: dict) -> list[str]:
    """The rounds of one stream beside N (streams.side_by_side): the table's is the median gain's."""
    if "rounds_gain" not in m:
        return []
    gains, growths = (", ".join(f"{x:.2f}×" for x in m[key]) for key in ("rounds_gain", "rounds_itl_growth"))
    return [f"One stream, then {m['many']['streams']}, in turn: the round with the median gain above; every "
            f"round's gain {gains}, ITL p50 growth {growths}.", ""]  # fmt: skip


def _graph_row(g: dict, batch_one_ms: float) -> str:
    return f"| {g['batch']} | {g['step_ms']:.1f} | {g['ms_per_row']:.1f} | {g['step_ms'] / batch_one_ms:.2f}× |"


def _admission_row(a: dict) -> str:
    how = "whole" if a["prefill_chunk"] is None else f"chunks of {a['prefill_chunk']}"
    if a.get("prefill_budget") is not None:
        how = f"chunks of {a['prefill_budget']:g}× a step's time, at most {a['prefill_chunk']} tokens"
    return (
        f"| {how} | {a['itl_p50_before_ms']:.1f} | {a['itl_p99_during_ms']:.1f} | {a['stall_max_ms']:.1f} | "
        f"{a['p99_over_p50']:.2f} | {a['long_prompt_first_token_s']:.2f} | "
        f"{', '.join(f'{r:.2f}' for r in a.get('rounds_p99_over_p50', [a['p99_over_p50']]))} |"
    )


def write_streams_report(results: dict, out: Path) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "streams.json").write_text(json.dumps(results | {"figures": figures(results["measured"])}, indent=2))
    (out / "streams.md").write_text(markdown(results))
