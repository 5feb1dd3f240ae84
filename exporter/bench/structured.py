"""`aotpack bench --serve --streams N --structured`: what structured output costs a decode step, over HTTP.

Owns: constrained (a JSON schema) against free streaming completions on one running server, at 1 and N
concurrent clients, timed from the tokens each client receives; `aotpack serve` (OpenAI's
`response_format`) and, with --llama-server, llama.cpp's server (its `json_schema` field) on the same
weights; structured.md / structured.json. The schema asks for one long string, so that a constrained
reply runs to the token budget as a free one does, and the two decode the same number of steps.
This is a benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from exporter.bench.config import BenchConfig
from exporter.bench.serving import LLAMA_SERVER, _llama_server, aotpack_command, run_servers, running

SCHEMA = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 1000}},
    "required": ["story"],
    "additionalProperties": False,
}
# each server's own way of asking for the schema on /v1/completions
CONSTRAINED = {
    "aotpack serve": {"response_format": {"type": "json_schema", "json_schema": {"name": "story", "schema": SCHEMA}}},
    LLAMA_SERVER: {"json_schema": SCHEMA},
}
KINDS = ("free", "json")


def stream_times(url: str, model: str, prompt: str, new_tokens: int, extra: dict) -> tuple[list[float], str]:
    """One greedy streaming completion: (time.perf_counter() of each chunk that carried text, the text)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=1800)
    stream = client.completions.create(
        model=model, prompt=prompt, max_tokens=new_tokens, temperature=0, stream=True, extra_body=extra
    )
    times, pieces = [], []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            times.append(time.perf_counter())
            pieces.append(chunk.choices[0].text)
    return times, "".join(pieces)


def load(url: str, model: str, clients: int, new_tokens: int, extra: dict) -> dict:
    """`clients` concurrent completions: aggregate tokens/s and the inter-token gaps every client saw."""
    prompts = [f"Tell me a story about the number {i}." for i in range(clients)]
    with ThreadPoolExecutor(clients) as pool:
        start = time.perf_counter()
        replies = list(pool.map(lambda p: stream_times(url, model, p, new_tokens, extra), prompts))
        wall = time.perf_counter() - start
    gaps = sorted(1e3 * (b - a) for times, _ in replies for a, b in itertools.pairwise(times))  # ms
    chunks = sum(len(times) for times, _ in replies)
    return {
        "clients": clients,
        "chunks": chunks,
        "tokens_per_s": chunks / wall,
        "itl_p50_ms": statistics.median(gaps) if gaps else None,
        "itl_p99_ms": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] if gaps else None,
        "texts": [text for _, text in replies],
    }


def measure(url: str, model: str, streams: int, new_tokens: int, constrained: dict) -> dict:
    """Free and constrained loads at 1 and `streams` clients, after one warming request of each (a
    grammar engine builds its view of the vocabulary on the first constrained request)."""
    for extra in ({}, constrained):
        stream_times(url, model, "Hello", 4, extra)
    return {f"{kind}@{n}": load(url, model, n, new_tokens, extra) for n in (1, streams) for kind, extra in
            zip(KINDS, ({}, constrained), strict=True)}  # fmt: skip


def bench_structured(config: BenchConfig, log=print) -> dict:
    threads, variant = config.threads, config.variants[0]
    servers = {"aotpack serve": lambda bundle, checkpoint, port: (aotpack_command(bundle, port, threads), bundle.name)}
    if config.llama_server is not None:
        servers[LLAMA_SERVER] = lambda bundle, checkpoint, port: _llama_server(config, variant, checkpoint, port)

    def measured(name: str, command: list[str], port: int, config: BenchConfig, model: str) -> dict:
        with running(command, port, config, model) as (url, cold):
            loads = measure(url, model, config.streams, config.new_tokens, CONSTRAINED[name])
        return {"server": name, "cold_start_first_token_s": cold, "loads": loads}

    results = run_servers(config, servers, "aotpack-structured-", log, measured)
    write_structured_report(results, config.out)
    return results


def figures(server: dict, streams: int) -> dict:
    """Per client count: constrained over free, in inter-token p50 and in aggregate tokens/s, and the
    milliseconds a step gains."""
    out = {}
    for n in (1, streams):
        free, constrained = server["loads"][f"free@{n}"], server["loads"][f"json@{n}"]
        out[n] = {
            "itl_ratio": constrained["itl_p50_ms"] / free["itl_p50_ms"],
            "added_ms": constrained["itl_p50_ms"] - free["itl_p50_ms"],
            "tps_ratio": constrained["tokens_per_s"] / free["tokens_per_s"],
            "json_prefix": sum("".join(text.split()).startswith('{"story"') for text in constrained["texts"]),
        }
    return out


HEADER = (
    "| server | clients | free tokens/s | constrained tokens/s | free ITL p50 (ms) | constrained ITL p50 (ms) | "
    "added per token (ms) | constrained ÷ free ITL | replies that open the schema's object |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def markdown(results: dict) -> str:
    cfg, streams = results["config"], results["config"]["streams"]
    rows = []
    for server in results["servers"]:
        f = figures(server, streams)
        for n in (1, streams):
            free, constrained = server["loads"][f"free@{n}"], server["loads"][f"json@{n}"]
            rows.append(
                f"| {server['server']}{' (`-nr`)' if server.get('fallback') else ''} | {n} | "
                f"{free['tokens_per_s']:.1f} | {constrained['tokens_per_s']:.1f} | {free['itl_p50_ms']:.1f} | "
                f"{constrained['itl_p50_ms']:.1f} | {f[n]['added_ms']:+.2f} | {f[n]['itl_ratio']:.3f}× | "
                f"{f[n]['json_prefix']} of {n} |"
            )
    intro = (
        f"{results['machine']['cpu']}, {cfg['threads']} threads; streaming `/v1/completions`, greedy, "
        f"{cfg['new_tokens']} tokens each, 1 then {streams} concurrent clients; constrained: a JSON schema of one "
        "string of at least 1,000 characters (aotpack: `response_format` json_schema, llguidance; llama-server: "
        "`json_schema`, its GBNF grammar). Token gaps are what each client received."
    )
    title = f"# Structured output against free text: {cfg['model']}, {results['variant']}"
    return "\n".join([title, "", intro, "", HEADER, *rows]) + "\n"


def write_structured_report(results: dict, out: Path) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figs = {s["server"]: figures(s, results["config"]["streams"]) for s in results["servers"]}
    (out / "structured.json").write_text(json.dumps(results | {"figures": figs}, indent=2))
    (out / "structured.md").write_text(markdown(results))
