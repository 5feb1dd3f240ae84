"""`aotpack bench --streams N --serve --ray`: one bundle served by `aotpack serve` alone and through Ray
Serve with 1 and 2 replicas, the same N concurrent streaming clients each.

Owns: the scale-out measurement and ray.md / ray.json. The machine's threads are shared among the
replicas (2 replicas of T/2 threads against 1 of T), so the table says what splitting one machine into
replicas costs or gains, and what Ray's proxy adds, before a second node is involved.
This is a benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import json
from pathlib import Path

from exporter.bench.config import BenchConfig
from exporter.bench.serving import aotpack_command, run_servers

SERVERS = {"aotpack serve": None, "aotpack serve --ray --replicas 1": 1, "aotpack serve --ray --replicas 2": 2}


def bench_ray(config: BenchConfig, log=print) -> dict:
    servers = {name: _launcher(config.threads, replicas) for name, replicas in SERVERS.items()}
    results = run_servers(config, servers, "aotpack-ray-", log)
    write_ray_report(results, config.out)
    return results


def _launcher(threads: int, replicas: int | None):
    def launch(bundle, checkpoint, port):
        command = aotpack_command(bundle, port, threads, replicas)
        return command, bundle.name, {"replicas": replicas or 1, "threads": int(command[-1])}

    return launch


def markdown(results: dict) -> str:
    cfg, servers = results["config"], results["servers"]
    alone = servers[0]
    rows = [
        f"| {s['server']} | {s['replicas']} × {s['threads']} | {s['cold_start_first_token_s']:.1f} | "
        f"{s['tokens_per_s']:.1f} | {s['tokens_per_s'] / alone['tokens_per_s']:.2f}× | {s['ttft_p50_s']:.2f} | "
        f"{sum(a == b for a, b in zip(s['texts'], alone['texts'], strict=True))} of {len(s['texts'])} |"
        for s in servers
    ]
    return "\n".join([
        f"# aotpack serve alone and on Ray Serve: {cfg['model']}, {results['variant']}",
        "",
        f"{results['machine']['cpu']}, {cfg['threads']} threads shared among the replicas; {cfg['streams']} "
        f"concurrent streaming clients (openai), greedy, {cfg['new_tokens']} tokens each, after one warm request "
        f"per client; each replica has {cfg['streams']} cache rows. Cold start runs from spawning the command "
        f"(Ray's start included) to the first token.",
        "",
        "| server | replicas × threads | cold start to first token (s) | aggregate tokens/s | vs alone | "
        "TTFT p50 under load (s) | replies equal to alone's |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]) + "\n"  # fmt: skip


def write_ray_report(results: dict, out: Path) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ray.json").write_text(json.dumps(results, indent=2))
    (out / "ray.md").write_text(markdown(results))
