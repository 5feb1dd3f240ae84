"""What every benchmark mode does around its measurement: run a command, export a variant's bundle with
`aotpack export`, describe the machine.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from exporter.bench import BenchError
from exporter.bench.config import variant_dtype
from runtime.format.quant import METHODS


class WorkerCrashed(BenchError):
    """A benchmark process was killed by a signal (a native crash), not by an error it reported."""


def run(cmd: list[str], env: dict | None = None) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode < 0:
        raise WorkerCrashed(f"{' '.join(cmd[:6])} … was killed by signal {-done.returncode}:\n{done.stderr[-3000:]}")
    if done.returncode != 0:
        raise BenchError(f"{' '.join(cmd[:6])} … failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def export_variant(
    checkpoint: Path,
    bundle: Path,
    variant: str,
    max_cache_len: int,
    gemv: str,
    batch: int = 1,
    onnx: bool = False,
    extra: tuple[str, ...] = (),
) -> float:
    """Build the variant's bundle with `aotpack export` (`onnx`: with decode.onnx; `extra`: more export
    options); returns the build time in seconds."""
    start = time.perf_counter()
    quantize = ["--quantize", variant] if variant in METHODS else []
    quantize += ["--onnx"] if onnx else []
    run(
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "export",
            str(checkpoint),
            "--out",
            str(bundle),
            "--dtype",
            variant_dtype(variant),
            *quantize,
            "--gemv",
            gemv,
            "--max-cache-len",
            str(max_cache_len),
            "--batch-size",
            str(batch),
            *extra,
            "--force",
        ]
    )
    return time.perf_counter() - start


def chunk_graph(config) -> tuple[str, ...]:
    """The export options a --streams or --serve bundle takes for the bench's --chunk-graph."""
    return ("--chunk-graph", str(config.chunk_graph)) if config.chunk_graph else ()


# the vector ISAs that decide which kernels Inductor and llama.cpp can use on this CPU
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def header(config) -> dict:
    """What every results file opens with: the run's options (paths as text) and the machine."""
    return {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()},
        "machine": machine(),
    }


def machine() -> dict:
    info = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    field = lambda name: next((line.split(":", 1)[1].strip() for line in info if line.startswith(name)), "")  # noqa: E731
    flags = set(field("flags").split())
    return {
        "cpu": field("model name") or platform.processor(),
        "isa": [flag for flag in ISA_FLAGS if flag in flags],
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }


def random_prompt(vocab: int, length: int) -> list[int]:
    """The benchmark's prompt: seeded random token ids below `vocab`, the same for every system."""
    g = torch.Generator().manual_seed(0)
    return torch.randint(10, vocab, (length,), generator=g).tolist()


def measure(system: str, path: Path, variant: str, prompt: list[int], config, scratch: Path, extra=()) -> dict:
    """One worker process (exporter.bench.worker) measuring `system`; `extra`: more worker arguments."""
    # A fresh Inductor cache per process: torch.compile must pay its compile as on a new machine,
    # not reuse kernels an earlier run left in /tmp/torchinductor_*.
    env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(scratch / f"inductor-{system}-{variant}")}
    cmd = [
        sys.executable,
        "-m",
        "exporter.bench.worker",
        "--system",
        system,
        "--path",
        str(path),
        "--dtype",
        variant_dtype(variant),
        "--variant",
        variant,
        "--prompt",
        ",".join(map(str, prompt)),
        "--new-tokens",
        str(config.new_tokens),
        "--threads",
        str(config.threads),
        "--n-ctx",
        str(config.max_cache_len),
        "--spawned-at",
        repr(time.time()),
        *extra,
    ]
    before = cpu_ticks()
    try:
        figures = json.loads(run(cmd, env).strip().splitlines()[-1])
    except WorkerCrashed:
        if system != "llama_cpp":
            raise
        # llama.cpp's extra CPU buffer types (AMX, repacked quantized weights) segfault on some machines
        # (Q8_0 and Q4_K_M on the Xeon with AMX here, at any n_ctx): rerun on its plain CPU buffers, and say so.
        figures = json.loads(run([*cmd, "--no-extra-bufts"], env).strip().splitlines()[-1])
        figures["llama_cpp_extra_bufts"] = False
    return figures | {"cpu_steal": steal_share(before, cpu_ticks())}


def cpu_ticks() -> tuple[int, int] | None:
    """(all, stolen) CPU ticks since boot from /proc/stat; None off Linux."""
    stat = Path("/proc/stat")
    if not stat.exists():
        return None
    ticks = [int(t) for t in stat.read_text().split("\n", 1)[0].split()[1:9]]  # user … softirq, steal
    return sum(ticks), ticks[7]


def steal_share(before, after) -> float | None:
    """The share of CPU time the hypervisor gave to other guests in between: what makes a shared VM's
    figures drift (30-55 % at times on this machine, when a step took 2-3× its quiet time)."""
    if before is None or after is None or after[0] == before[0]:
        return None
    return (after[1] - before[1]) / (after[0] - before[0])
