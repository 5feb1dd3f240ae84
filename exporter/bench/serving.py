"""`aotpack bench --serve`: `aotpack serve` side by side with `transformers serve`, over HTTP.

Owns: starting each server as a process of its own on a free 127.0.0.1 port, timing the first token of
the first request from the moment the process was spawned (cold start: imports, loading, and for
`--compile` whatever compiling the first request triggers), then N concurrent streaming clients (the
official `openai` client, `/v1/completions`) and their aggregate tokens/s, and serve.md / serve.json with a
verdict per target of the serving issue. Every server gets the same prompts, greedy, the same token budget;
with `--llama-server`, llama.cpp's own server runs beside them (`--parallel N`, the same weights as a
GGUF at the bundle's precision, each slot a cache as long as the bundle's).
This is a benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from exporter.bench.build import chunk_graph, export_variant, machine
from exporter.bench.config import BenchConfig
from exporter.bench.llama_cpp import GGUF_TYPE, gguf_for
from exporter.bench.report import verdict_of
from exporter.source import checkpoint_dir

# name -> transformers serve flags
HF_SERVERS = {
    "transformers serve": [],
    "transformers serve --compile": ["--compile"],
    "transformers serve --continuous-batching": ["--continuous-batching"],
}
TARGETS = (
    ("cold start ≥ 10× shorter than transformers serve --compile", "cold_vs_compile", (">=", 10.0)),
    ("cold start ≤ transformers serve's (no compile)", "cold_vs_plain", ("<=", 1.0)),
    ("aggregate tokens/s, N clients ≥ 1.5× transformers serve --continuous-batching", "tps_vs_cb", (">=", 1.5)),
    ("aggregate tokens/s, N clients ≥ 1.0× llama-server --parallel N", "tps_vs_llama_server", (">=", 1.0)),
)
LLAMA_SERVER = "llama-server"


class ServerCrashed(RuntimeError):
    """The server process ended before it answered."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def aotpack_command(path: Path, port: int, threads: int, replicas: int | None = None) -> list[str]:
    """`aotpack serve`, or with `replicas` `aotpack serve --ray` sharing the threads among the replicas."""
    command = [sys.executable, "-m", "runtime", "serve", str(path), "--port", str(port)]
    if replicas is None:
        return command + ["--threads", str(threads)]
    return command + ["--ray", "--replicas", str(replicas), "--threads", str(max(1, threads // replicas))]


def _command(name: str, path: Path, port: int, config: BenchConfig, dtype: str) -> list[str]:
    if name == "aotpack serve":
        return aotpack_command(path, port, config.threads)
    flags = ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", dtype]
    script = Path(sys.executable).parent / "transformers"  # transformers' console script, beside this python
    return [str(script), "serve", str(path), *flags, *HF_SERVERS[name]]


def llama_server_command(config: BenchConfig, gguf: Path, port: int) -> list[str]:
    """llama.cpp's server with N slots, each of the bundle's cache length (-c is all slots' tokens)."""
    n, threads = config.streams, str(config.threads)
    return [
        str(config.llama_server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "-t", threads, "-tb", threads, "--parallel", str(n), "-c", str(n * config.max_cache_len),
    ]  # fmt: skip


def _ask(url: str, model: str, prompt: str, new_tokens: int) -> tuple[float, float, int, str]:
    """One streaming completion: (time.time() of its first token, seconds to it, tokens, text). A plain
    prompt, not chat: base checkpoints (Gemma 3 270M) have no chat template."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=1800)
    start, first, pieces = time.time(), None, []
    stream = client.completions.create(
        model=model, prompt=prompt, max_tokens=new_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    tokens = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            first = first or time.time()
            pieces.append(chunk.choices[0].text)
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    tokens = len(pieces) if tokens is None else tokens  # a server that sends no usage: one chunk a token
    first = first or time.time()
    return first, first - start, tokens, "".join(pieces)


def _first_answer(url: str, model: str, prompt: str, new_tokens: int, spawned: float, proc, log) -> float:
    """Seconds from spawn to the first token of the first request, retrying until the server answers:
    the port refuses connections until it listens, and Ray Serve's proxy says 404 or 503 until the
    application is deployed."""
    from openai import APIStatusError

    while True:
        if proc.poll() is not None:
            log.seek(0)
            raise ServerCrashed(f"server exited with {proc.returncode}: {log.read()[-2000:]}")
        try:
            return _ask(url, model, prompt, new_tokens)[0] - spawned
        except APIStatusError as e:
            if e.status_code not in (404, 503):
                raise
        except Exception as e:  # noqa: BLE001 (connection refused until the server listens)
            if "Connection" not in type(e).__name__ and "connect" not in str(e).lower():
                raise
        time.sleep(0.2)


@contextmanager
def running(command: list[str], port: int, config: BenchConfig, model: str):
    """The server `command` started on `port`; yields (its URL, seconds from spawn to the first token of
    its first request: cold start). Ended when the block is left."""
    spawned = time.time()
    # stderr goes to a file, not a pipe: nobody reads it while the server runs (Ray's is chatty), and a
    # full pipe would block the server
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=log, text=True,
        env=os.environ | {"OMP_NUM_THREADS": str(config.threads)},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        yield url, _first_answer(url, model, "Tell me a story.", config.new_tokens, spawned, proc, log)
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        log.close()


def client_prompts(config: BenchConfig) -> list[str]:
    """One prompt per client, sharing their first words with each other and with the cold-start request
    (whose row the prefix cache keeps): the server's prefix copies and chunked admission run."""
    return [f"Tell me a story about the number {i}." for i in range(config.streams)]


def lone_replies(bundle: Path, config: BenchConfig) -> list[str]:
    """Each client's prompt through the bundle alone, one request at a time, the prefix cache off: the
    greedy reply of a row stepped alone (token-identical to HF's, which the parity tests check). A float32
    reply served that differs is a serving bug; in bf16 and int8 a batch's graph rounds otherwise than the
    batch-1 graph and near-tied tokens may flip (README, serving on the Zen 5)."""
    from runtime import load
    from runtime.config import LoadConfig

    rt = load(bundle, LoadConfig(num_threads=config.threads, prefix_cache=False))
    texts = []
    for prompt in client_prompts(config):
        ids = rt.tokenizer(prompt, return_tensors="pt").input_ids  # (1, S), as the server tokenizes it
        out = rt.submit(ids, max_new_tokens=config.new_tokens, do_sample=False).result()  # (1, S + n)
        texts.append(rt.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    return texts


def measure_server(name: str, command: list[str], port: int, config: BenchConfig, model: str) -> dict:
    """Cold start of the server `command` listening on `port`, then `config.streams` concurrent clients."""
    prompts = client_prompts(config)
    with running(command, port, config, model) as (url, cold), ThreadPoolExecutor(config.streams) as pool:
        list(pool.map(lambda p: _ask(url, model, p, 8), prompts))  # warm: every replica, every row
        start = time.time()
        answers = list(pool.map(lambda p: _ask(url, model, p, config.new_tokens), prompts))
        wall = time.time() - start
    tokens = sum(a[2] for a in answers)
    return {
        "server": name,
        "cold_start_first_token_s": cold,
        "clients": config.streams,
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "ttft_p50_s": sorted(a[1] for a in answers)[len(answers) // 2],
        "texts": [a[3] for a in answers],
    }


def bench_serve(config: BenchConfig, log=print) -> dict:
    threads, variant = config.threads, config.variants[0]
    servers = {"aotpack serve": lambda bundle, checkpoint, port: (aotpack_command(bundle, port, threads), bundle.name)}
    # transformers serve takes the checkpoint, and its model id is the path given; it has no counterpart
    # of a quantized bundle's weights (its own int8 would be another quantization), as in the batch-1 bench
    for name in HF_SERVERS if variant in config.dtypes else ():
        servers[name] = lambda bundle, checkpoint, port, name=name: (
            _command(name, checkpoint, port, config, variant),
            str(checkpoint),
        )
    if config.llama_server is not None:
        servers[LLAMA_SERVER] = lambda bundle, checkpoint, port: _llama_server(config, variant, checkpoint, port)
    results = run_servers(config, servers, "aotpack-serve-", log, lone=True)
    write_serve_report(results, config.out)
    return results


def _llama_server(config: BenchConfig, variant: str, checkpoint: Path, port: int):
    """llama-server on the variant's GGUF. Its repacked weight buffers (AMX, interleaved quants) crashed
    it with SIGILL on the AMX Xeon here, as they crash llama-cpp-python (exporter.bench.worker): if it
    dies, it is run again with `--no-repack` (`fallback`), and the result says so."""
    gguf = gguf_for(checkpoint, variant, config.llama_cpp_converter, Path(config.out) / "gguf")
    extra = {"weights": GGUF_TYPE[variant], "fallback": lambda port: [*llama_server_command(config, gguf, port), "-nr"]}
    return llama_server_command(config, gguf, port), gguf.name, extra


def run_servers(config: BenchConfig, servers: dict, prefix: str, log, measure=measure_server, lone=False) -> dict:
    """Export one bundle with `config.streams` cache rows, then measure each server in turn. `servers`:
    name -> launch(bundle, checkpoint, port) -> (command, model id[, extra result fields]); `measure`:
    (name, command, port, config, model) -> the server's result. `lone`: then the clients' prompts through
    the bundle one at a time (`lone_texts`: what the served replies must equal)."""
    variant = config.variants[0]
    results = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()}}
    results |= {"machine": machine(), "variant": variant, "servers": []}
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp, checkpoint_dir(config.model) as checkpoint:
        bundle = Path(tmp) / "bundle"
        log(f"[{variant}] exporting a bundle with {config.streams} cache rows")
        results["build_s"] = export_variant(
            checkpoint, bundle, variant, config.max_cache_len, config.gemv, batch=config.streams,
            extra=chunk_graph(config),
        )  # fmt: skip
        for name, launch in servers.items():
            log(f"[{variant}] {name}: cold start, then {config.streams} concurrent streaming clients")
            port = _free_port()
            command, model, *extra = launch(bundle, Path(checkpoint), port)
            extra = dict(extra[0]) if extra else {}
            fallback = extra.pop("fallback", None)
            try:
                result = measure(name, command, port, config, model=model)
            except ServerCrashed as e:
                if fallback is None:
                    raise
                log(f"[{variant}] {name} crashed ({str(e).splitlines()[0]}); running it again with its fallback")
                port = _free_port()
                result = measure(name, fallback(port), port, config, model=model) | {"fallback": True}
            results["servers"].append(result | extra)
        if lone:
            log(f"[{variant}] each client's prompt through the bundle alone")
            results["lone_texts"] = lone_replies(bundle, config)
    return results


def figures(results: dict) -> dict:
    """Ratios of aotpack serve to each server that ran (None where one did not: transformers serve runs
    beside float bundles only, llama-server when given)."""
    by = {s["server"]: s for s in results["servers"]}
    ours, plain, compiled = by["aotpack serve"], by.get("transformers serve"), by.get("transformers serve --compile")
    cb, llama = by.get("transformers serve --continuous-batching"), by.get(LLAMA_SERVER)
    cold = "cold_start_first_token_s"
    return {
        "cold_vs_compile": compiled[cold] / ours[cold] if compiled else None,
        "cold_vs_plain": ours[cold] / plain[cold] if plain else None,
        "tps_vs_cb": ours["tokens_per_s"] / cb["tokens_per_s"] if cb else None,
        "tps_vs_llama_server": ours["tokens_per_s"] / llama["tokens_per_s"] if llama else None,
        "same_text_as_lone": _agree(ours, {"texts": results["lone_texts"]}) if "lone_texts" in results else None,
        "same_text_as_plain": _agree(ours, plain) if plain else None,
        "plain_same_as_cb": _agree(plain, cb) if plain and cb else None,
    }


def _agree(a: dict, b: dict) -> int:
    """How many of the clients' greedy replies are the same text on both servers."""
    return sum(x == y for x, y in zip(a["texts"], b["texts"], strict=True))


def markdown(results: dict) -> str:
    f, cfg = figures(results), results["config"]
    rows = [
        f"| {s['server']}{' (`-nr`: it crashed with repacking)' if s.get('fallback') else ''} | "
        f"{s['cold_start_first_token_s']:.1f} | {s['tokens_per_s']:.1f} | {s['ttft_p50_s']:.2f} |"
        for s in results["servers"]
    ]
    lines = [
        f"# aotpack serve vs transformers serve: {cfg['model']}, {results['variant']}",
        "",
        f"{results['machine']['cpu']}, {cfg['threads']} threads; {cfg['streams']} concurrent streaming clients "
        f"(openai), greedy, {cfg['new_tokens']} tokens each; the bundle was built in {results['build_s']:.0f} s "
        f"(not counted in cold start).{_agreement(f, cfg['streams'])}",
        "",
        "| server | cold start to first token (s) | aggregate tokens/s | TTFT p50 under load (s) |",
        "|---|---|---|---|",
        *rows,
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        *(
            f"| {label} | {f[key]:.2f}× | {verdict_of(f[key], bound)} |"
            for label, key, bound in TARGETS
            if f[key] is not None
        ),
    ]
    return "\n".join(lines) + "\n"


def _agreement(f: dict, clients: int) -> str:
    lone, text = f.get("same_text_as_lone"), ""
    if lone is not None:
        text = f" aotpack serve's greedy replies equal to the bundle's own, each prompt alone: {lone} of {clients}."
    if f["same_text_as_plain"] is None:
        return text
    both = f" transformers serve's own two modes agree on {f['plain_same_as_cb']}." if f["plain_same_as_cb"] else ""
    return text + f" Greedy replies equal to transformers serve's: {f['same_text_as_plain']} of {clients};{both}"


def write_serve_report(results: dict, out: Path) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve.json").write_text(json.dumps(results | {"figures": figures(results)}, indent=2))
    (out / "serve.md").write_text(markdown(results))
