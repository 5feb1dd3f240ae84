"""`aotpack bench --serve --streams N --prefix-cache`: time to first token with a shared system prompt.

Owns: one running server at a time answering, one after another, requests that share a long system
prompt (`--long-prompt` tokens' worth of the accuracy text) and differ in a short user turn; the first
request finds nothing cached, the later ones can start from the first's row. `aotpack serve` with and
without its prefix cache and, with --llama-server, llama.cpp's server (its prompt cache, on by default)
on the same weights; prefix.md / prefix.json. This is a benchmark, not a test: nothing here asserts a
speed.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from exporter.accuracy import TEXT
from exporter.bench.config import BenchConfig
from exporter.bench.serving import LLAMA_SERVER, _llama_server, aotpack_command, run_servers, running

LATER = 5  # requests after the first, each with its own user turn
TURN = "Question {i}: in one sentence, what does the text above say about the river and the town, part {i}?"
NO_CACHE = "aotpack serve --no-prefix-cache"


CHARS_PER_TOKEN = 4.7  # of this English text, for SmolLM2's and Gemma 3's tokenizers alike (about)


def system_prompt(tokens: int) -> str:
    """About `tokens` tokens of the accuracy text, repeated as needed (the report gives the real count)."""
    text, chars = " ".join(TEXT.split()), int(CHARS_PER_TOKEN * tokens)
    return ((text + " ") * (1 + chars // len(text)))[:chars]


def first_token_s(url: str, model: str, prompt: str, new_tokens: int) -> tuple[float, dict | None]:
    """Seconds from sending one greedy streaming completion to its first text, and the usage it reports."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=1800)
    start, first, usage = time.perf_counter(), None, None
    stream = client.completions.create(
        model=model, prompt=prompt, max_tokens=new_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].text:
            first = time.perf_counter() - start
        usage = chunk.usage.model_dump() if chunk.usage else usage
    return first, usage


def measure(url: str, model: str, config: BenchConfig) -> dict:
    """The first request with the shared system prompt, then LATER more with other user turns."""
    system = system_prompt(config.long_prompt)
    first_token_s(url, model, "Hello", 2)  # warm the server's code paths, on an unrelated prompt
    runs = [first_token_s(url, model, f"{system}\n\n{TURN.format(i=i)}\n", 8) for i in range(1 + LATER)]
    cached = [(usage or {}).get("prompt_tokens_details") or {} for _, usage in runs]
    later = [seconds for seconds, _ in runs[1:]]
    return {
        "first_s": runs[0][0],
        "later_s": later,
        "later_median_s": statistics.median(later),
        "ratio": statistics.median(later) / runs[0][0],
        "prompt_tokens": (runs[0][1] or {}).get("prompt_tokens"),
        "cached_tokens": [c.get("cached_tokens") for c in cached],
    }


def bench_prefix(config: BenchConfig, log=print) -> dict:
    threads, variant = config.threads, config.variants[0]
    servers = {
        "aotpack serve": lambda bundle, checkpoint, port: (aotpack_command(bundle, port, threads), bundle.name),
        NO_CACHE: lambda bundle, checkpoint, port: ([*aotpack_command(bundle, port, threads), "--no-prefix-cache"],
                                                    bundle.name),
    }  # fmt: skip
    if config.llama_server is not None:
        servers[LLAMA_SERVER] = lambda bundle, checkpoint, port: _llama_server(config, variant, checkpoint, port)

    def measured(name: str, command: list[str], port: int, config: BenchConfig, model: str) -> dict:
        with running(command, port, config, model) as (url, cold):
            return {"server": name, "cold_start_first_token_s": cold} | measure(url, model, config)

    results = run_servers(config, servers, "aotpack-prefix-", log, measured)
    write_prefix_report(results, config.out)
    return results


HEADER = (
    "| server | prompt tokens | first request TTFT (s) | later requests TTFT, median (s) | later ÷ first | "
    "cached tokens reported (later) |\n|---|---|---|---|---|---|"
)


def markdown(results: dict) -> str:
    cfg = results["config"]
    rows = [
        f"| {s['server']}{' (`-nr`)' if s.get('fallback') else ''} | {s['prompt_tokens']} | {s['first_s']:.3f} | "
        f"{s['later_median_s']:.3f} | {s['ratio']:.3f}× | {', '.join(str(c) for c in s['cached_tokens'][1:])} |"
        for s in results["servers"]
    ]
    intro = (
        f"{results['machine']['cpu']}, {cfg['threads']} threads; streaming `/v1/completions`, greedy, 8 tokens each, "
        f"one client; a system prompt of about {cfg['long_prompt']} tokens shared by {1 + LATER} requests whose "
        "user turns differ (about 20 tokens; the prompts' own count is in the table); time to the first text, "
        f"from the client. Each server started fresh with {cfg['streams']} slots of {cfg['max_cache_len']} tokens, "
        "and answered two short unrelated requests first (the first request is not a cold start)."
    )
    title = f"# Prefix cache: a shared system prompt, {cfg['model']}, {results['variant']}"
    return "\n".join([title, "", intro, "", HEADER, *rows]) + "\n"


def write_prefix_report(results: dict, out: Path) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "prefix.json").write_text(json.dumps(results, indent=2))
    (out / "prefix.md").write_text(markdown(results))
