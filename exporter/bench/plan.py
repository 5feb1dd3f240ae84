"""`aotpack bench`: HF eager, HF + torch.compile, aotpack and llama.cpp on one model, prompt and machine.

Owns: the benchmark plan. A variant is a bundle dtype ("float32", "bfloat16") or a quantization
("int8", "int4": weight-only, float32 activations). Each (variant, round, system) runs in a fresh
subprocess (`exporter.bench.worker`) so start-up costs are real; rounds interleave the systems, so a
slow spell of this shared machine falls on all of them rather than on one. HF runs the float variants
only (it has no equivalent of aotpack's quantized bundles); llama.cpp, when `llama_cpp` is importable
and its converter script is given, runs every variant on the same weights converted to GGUF at the
matching precision (f32, bf16, Q8_0, Q4_K_M). The bundle's build time is measured by running
`aotpack export`. The roofline compares aotpack's decode step with the bytes it must read at the
bandwidth measured in the same round, and at the rate torch's own GEMV reads them.
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

from exporter.bench import BenchError
from exporter.bench.llama_cpp import gguf_for, llama_cpp_available
from exporter.bench.report import write_reports
from exporter.bench.roofline import bytes_per_step, gemv_bandwidth, read_bandwidth
from exporter.bench.worker import ONNX_SYSTEMS, SYSTEMS
from exporter.source import checkpoint_dir
from runtime.bundle import read_manifest
from runtime.quant import METHODS

HF_SYSTEMS = ("hf_eager", "hf_compile")

HF_COMPILE_NOTE = (
    "HF generate with cache_implementation='static' and a CompileConfig(fullgraph=True) whose "
    "_compile_all_devices=True forces torch.compile on CPU (generate compiles only on GPUs otherwise)"
)


@dataclass(frozen=True)
class BenchConfig:
    model: str = "gemma3-270m-arch"
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    quantize: tuple[str, ...] = ()  # extra variants: weight-only int8/int4 bundles with float32 activations
    llama_cpp_converter: Path | None = None  # llama.cpp's convert_hf_to_gguf.py (in the llama-cpp-python sdist)
    gemv: str = "tune"  # passed to `aotpack export --gemv`
    prompt_len: int = 32
    new_tokens: int = 64
    threads: int = os.cpu_count() or 1
    out: Path = Path("artifacts/bench")
    systems: tuple[str, ...] = SYSTEMS
    rounds: int = 1
    streams: int | None = None  # continuous-batching mode (exporter.bench.concurrency): N concurrent streams
    long_prompt: int = 512  # ...and the prompt admitted while N - 1 of them decode
    prefill_chunk: int = 32  # ...prefilled whole, then in chunks of this many tokens
    serve: bool = False  # `aotpack serve` against `transformers serve` (exporter.bench.serving), N = streams
    ray: bool = False  # with serve: alone and on Ray Serve with 1 and 2 replicas (exporter.bench.scaleout)
    onnx: bool = False  # the float32 bundle also decodes on ONNX Runtime (its decode.onnx), as two more systems

    def __post_init__(self):
        if self.prompt_len < 1 or self.new_tokens <= 4:
            raise BenchError(
                f"--prompt-len must be >= 1 and --new-tokens > 4, got {self.prompt_len}, {self.new_tokens}"
            )
        if self.rounds < 1:
            raise BenchError(f"--rounds must be >= 1, got {self.rounds}")
        if self.serve and self.streams is None:
            raise BenchError("--serve needs --streams N: the number of concurrent clients")
        if self.ray and not self.serve:
            raise BenchError("--ray compares servers: add --serve and --streams N")
        if self.streams is not None and (self.streams < 2 or len(self.variants) != 1):
            raise BenchError(
                f"--streams needs N >= 2 and exactly one variant (one --dtype or --quantize), got "
                f"{self.streams} and {list(self.variants)}"
            )
        if unknown := set(self.systems) - set(SYSTEMS):
            raise BenchError(f"unknown systems {sorted(unknown)}; choose from {SYSTEMS}")
        if unknown := set(self.quantize) - set(METHODS):
            raise BenchError(f"unknown --quantize {sorted(unknown)}; choose from {METHODS}")
        if self.onnx and ("float32" not in self.dtypes or self.streams is not None):
            raise BenchError(
                "--onnx benchmarks the float32 bundle at batch 1: keep float32 among --dtype, no --streams"
            )
        if self.llama_cpp_converter is not None and not Path(self.llama_cpp_converter).is_file():
            raise BenchError(
                f"--llama-cpp-converter {self.llama_cpp_converter} is not a file; it is "
                "vendor/llama.cpp/convert_hf_to_gguf.py in the llama-cpp-python sdist"
            )

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(self.dtypes) + tuple(self.quantize)

    def systems_for(self, variant: str) -> tuple[str, ...]:
        onnx = self.onnx and variant == "float32"  # ONNX Runtime decodes float32 bundles only
        systems = [
            s
            for s in self.systems
            if s != "llama_cpp" and (variant in self.dtypes or s not in HF_SYSTEMS) and (onnx or s not in ONNX_SYSTEMS)
        ]
        if "llama_cpp" in self.systems and self.llama_cpp_converter is not None and llama_cpp_available():
            systems.append("llama_cpp")
        return tuple(systems)


def _prompt(vocab: int, length: int) -> list[int]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(10, vocab, (length,), generator=g).tolist()


def run(cmd: list[str], env: dict | None = None) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise BenchError(f"{' '.join(cmd[:4])} … failed:\n{done.stderr[-3000:]}")
    return done.stdout


def variant_dtype(variant: str) -> str:
    """The bundle dtype of a variant: quantized variants keep float32 activations, KV cache and norms."""
    return "float32" if variant in METHODS else variant


def export_variant(
    checkpoint: Path, bundle: Path, variant: str, max_cache_len: int, gemv: str, batch: int = 1, onnx: bool = False
) -> float:
    """Build the variant's bundle with `aotpack export` (`onnx`: with decode.onnx); returns the build time
    in seconds."""
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
            "--force",
        ]
    )
    return time.perf_counter() - start


def _measure(system: str, path: Path, variant: str, prompt: list[int], config: BenchConfig, scratch: Path) -> dict:
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
        "--spawned-at",
        repr(time.time()),
    ]
    return json.loads(run(cmd, env).strip().splitlines()[-1])


# the vector ISAs that decide which kernels Inductor and llama.cpp can use on this CPU
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


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


def bench(config: BenchConfig, log=print) -> dict:
    if config.ray:
        from exporter.bench.scaleout import bench_ray

        return bench_ray(config, log)
    if config.serve:
        from exporter.bench.serving import bench_serve

        return bench_serve(config, log)
    if config.streams is not None:
        from exporter.bench.concurrency import bench_streams

        return bench_streams(config, log)
    results = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()},
        "variants": list(config.variants),
        "machine": machine(),
        "hf_compile_how": HF_COMPILE_NOTE,
        "runs": [],
        "builds": {},
        "read_rates": [],
        "accuracy": {},
    }
    with tempfile.TemporaryDirectory(prefix="aotpack-bench-") as tmp, checkpoint_dir(config.model) as checkpoint:
        from transformers import AutoConfig

        vocab = min(AutoConfig.from_pretrained(checkpoint).get_text_config().vocab_size, 32000)
        prompt = _prompt(vocab, config.prompt_len)
        for variant in config.variants:
            _bench_variant(config, variant, checkpoint, prompt, Path(tmp), results, log)
    write_reports(results, config.out)
    return results


def _bench_variant(config: BenchConfig, variant: str, checkpoint: Path, prompt, tmp: Path, results: dict, log) -> None:
    bundle = tmp / f"bundle-{variant}"
    log(f"[{variant}] exporting the bundle")
    onnx = any(s in ONNX_SYSTEMS for s in config.systems_for(variant))
    results["builds"][variant] = export_variant(
        checkpoint, bundle, variant, config.prompt_len + config.new_tokens, config.gemv, onnx=onnx
    )
    manifest = read_manifest(bundle)
    results[f"step_bytes_{variant}"] = step = bytes_per_step(manifest)
    if manifest.accuracy is not None:
        results["accuracy"][variant] = asdict(manifest.accuracy)
    systems = config.systems_for(variant)
    paths = {"aotpack": bundle, "hf_eager": checkpoint, "hf_compile": checkpoint} | dict.fromkeys(ONNX_SYSTEMS, bundle)
    if "llama_cpp" in systems:
        log(f"[{variant}] converting the checkpoint to GGUF for llama.cpp")
        paths["llama_cpp"] = gguf_for(checkpoint, variant, config.llama_cpp_converter, tmp / "gguf")
    for round_ in range(config.rounds):
        for system in systems:
            log(f"[{variant}] round {round_ + 1}/{config.rounds}: {system}")
            run = _measure(system, paths[system], variant, prompt, config, tmp / f"round{round_}")
            results["runs"].append(run | {"round": round_})
        # Right after the runs: this machine's bandwidth drifts by a third within minutes, so each
        # round's floor is measured next to the decode it is compared with.
        log(f"[{variant}] round {round_ + 1}/{config.rounds}: read bandwidth and torch's GEMV")
        results["read_rates"].append({"dtype": variant, "round": round_} | _read_rates(step, variant, config.threads))


def _read_rates(step: dict, variant: str, threads: int) -> dict:
    """The read bandwidth, and for float variants the rate of torch's own GEMV on the largest weight
    (quantized weights have no torch GEMV to compare with)."""
    rates = {"bandwidth_gb_s": read_bandwidth(step["total_bytes"], threads) / 1e9}
    if variant not in METHODS:
        rows, cols = step["largest_weight"]
        rates["gemv_gb_s"] = gemv_bandwidth(rows, cols, getattr(torch, variant), threads) / 1e9
    return rates
