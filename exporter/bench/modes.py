"""`aotpack bench`'s modes, by name: which measurement a config asks for, and the report it writes.

Owns the registry that the CLI dispatches through; each mode's module imports the shared config and
build steps (exporter.bench.config, exporter.bench.build), never this registry or another mode.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from exporter.bench.config import BenchConfig


@dataclass(frozen=True)
class Mode:
    name: str
    module: str
    function: str  # (config, log) -> results
    report: str  # the markdown file it writes into config.out


MODES = (
    Mode("batch1", "exporter.bench.plan", "bench_batch1", "bench.md"),
    Mode("contexts", "exporter.bench.contexts", "bench_contexts", "contexts.md"),
    Mode("streams", "exporter.bench.concurrency", "bench_streams", "streams.md"),
    Mode("serve", "exporter.bench.serving", "bench_serve", "serve.md"),
    Mode("ray", "exporter.bench.scaleout", "bench_ray", "ray.md"),
    Mode("structured", "exporter.bench.structured", "bench_structured", "structured.md"),
    Mode("prefix", "exporter.bench.prefix", "bench_prefix", "prefix.md"),
    Mode("speculate", "exporter.bench.speculation", "bench_speculation", "speculation.md"),
)


def mode_of(config: BenchConfig) -> Mode:
    """--ray, else --structured, else --prefix-cache, else --speculate, else --serve, else --streams, else
    --contexts, else the batch-1 comparison."""
    name = "ray" if config.ray else "structured" if config.structured else "prefix" if config.prefix_cache else None
    name = name or ("speculate" if config.speculate else None)
    name = name or ("serve" if config.serve else "streams" if config.streams is not None else None)
    name = name or ("contexts" if config.contexts else "batch1")
    return next(m for m in MODES if m.name == name)


def bench(config: BenchConfig, log=print) -> dict:
    mode = mode_of(config)
    return getattr(importlib.import_module(mode.module), mode.function)(config, log)
