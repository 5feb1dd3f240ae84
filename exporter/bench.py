"""`aotpack bench`: HF eager, HF + torch.compile and aotpack on one model, prompt and machine.

Owns: the benchmark plan. Each (dtype, round, system) runs in a fresh subprocess
(`exporter.bench_worker`) so start-up costs are real; rounds interleave the systems, so a slow spell
of this shared machine falls on all three rather than on one. The bundle's build time is measured by
running `aotpack export`. The roofline compares aotpack's decode step with the bytes it must read at
the bandwidth measured in the same round, and at the rate torch's own GEMV reads them.
This is a benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from exporter.bench_report import write_reports
from exporter.bench_worker import SYSTEMS
from exporter.presets import PRESETS, build_preset
from exporter.roofline import bytes_per_step, gemv_bandwidth, read_bandwidth
from runtime.bundle import read_manifest
from runtime.errors import ExportError

HF_COMPILE_NOTE = (
    "HF generate with cache_implementation='static' and a CompileConfig(fullgraph=True) whose "
    "_compile_all_devices=True forces torch.compile on CPU (generate compiles only on GPUs otherwise)"
)


@dataclass(frozen=True)
class BenchConfig:
    model: str = "gemma3-270m-arch"
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    prompt_len: int = 32
    new_tokens: int = 64
    threads: int = os.cpu_count() or 1
    out: Path = Path("artifacts/bench")
    systems: tuple[str, ...] = SYSTEMS
    rounds: int = 1

    def __post_init__(self):
        if self.prompt_len < 1 or self.new_tokens <= 4:
            raise ExportError(f"--prompt-len must be >= 1 and --new-tokens > 4, got {self.prompt_len}, {self.new_tokens}")
        if self.rounds < 1:
            raise ExportError(f"--rounds must be >= 1, got {self.rounds}")
        if unknown := set(self.systems) - set(SYSTEMS):
            raise ExportError(f"unknown systems {sorted(unknown)}; choose from {SYSTEMS}")


def _prompt(vocab: int, length: int) -> list[int]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(10, vocab, (length,), generator=g).tolist()


def _run(cmd: list[str], env: dict | None = None) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise ExportError(f"{' '.join(cmd[:4])} … failed:\n{done.stderr[-3000:]}")
    return done.stdout


def _export(checkpoint: Path, bundle: Path, dtype: str, max_cache_len: int) -> float:
    start = time.perf_counter()
    _run([sys.executable, "-m", "exporter.cli", "export", str(checkpoint), "--out", str(bundle), "--dtype", dtype,
          "--max-cache-len", str(max_cache_len), "--force"])
    return time.perf_counter() - start


def _measure(system: str, path: Path, dtype: str, prompt: list[int], config: BenchConfig, scratch: Path) -> dict:
    # A fresh Inductor cache per process: torch.compile must pay its compile as on a new machine,
    # not reuse kernels an earlier run left in /tmp/torchinductor_*.
    env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(scratch / f"inductor-{system}-{dtype}")}
    cmd = [sys.executable, "-m", "exporter.bench_worker", "--system", system, "--path", str(path), "--dtype", dtype,
           "--prompt", ",".join(map(str, prompt)), "--new-tokens", str(config.new_tokens),
           "--threads", str(config.threads), "--spawned-at", repr(time.time())]
    return json.loads(_run(cmd, env).strip().splitlines()[-1])


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform()}


def bench(config: BenchConfig, log=print) -> dict:
    results = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()},
               "machine": machine(), "hf_compile_how": HF_COMPILE_NOTE, "runs": [], "builds": {}, "read_rates": []}
    with tempfile.TemporaryDirectory(prefix="aotpack-bench-") as tmp:
        checkpoint = build_preset(config.model, Path(tmp) / "ckpt") if config.model in PRESETS else Path(config.model)
        from transformers import AutoConfig

        vocab = min(AutoConfig.from_pretrained(checkpoint).get_text_config().vocab_size, 32000)
        prompt = _prompt(vocab, config.prompt_len)
        for dtype in config.dtypes:
            bundle = Path(tmp) / f"bundle-{dtype}"
            log(f"[{dtype}] exporting the bundle")
            results["builds"][dtype] = _export(checkpoint, bundle, dtype, config.prompt_len + config.new_tokens)
            results[f"step_bytes_{dtype}"] = step = bytes_per_step(read_manifest(bundle))
            for round_ in range(config.rounds):
                for system in config.systems:
                    log(f"[{dtype}] round {round_ + 1}/{config.rounds}: {system}")
                    path = bundle if system == "aotpack" else checkpoint
                    run = _measure(system, path, dtype, prompt, config, Path(tmp) / f"round{round_}")
                    results["runs"].append(run | {"round": round_})
                # Right after aotpack's run: this machine's bandwidth drifts by a third within minutes,
                # so each round's floor is measured next to the decode it is compared with.
                log(f"[{dtype}] round {round_ + 1}/{config.rounds}: read bandwidth and torch's GEMV")
                results["read_rates"].append({"dtype": dtype, "round": round_} | _read_rates(step, dtype, config.threads))
    write_reports(results, config.out)
    return results


def _read_rates(step: dict, dtype: str, threads: int) -> dict:
    rows, cols = step["largest_weight"]
    return {
        "bandwidth_gb_s": read_bandwidth(step["total_bytes"], threads) / 1e9,
        "gemv_gb_s": gemv_bandwidth(rows, cols, getattr(torch, dtype), threads) / 1e9,
    }
