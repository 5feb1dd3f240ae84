"""`aotpack bench`'s batch-1 mode: HF eager, HF + torch.compile, aotpack and llama.cpp on one model,
prompt and machine.

Owns: the batch-1 plan. A variant is a bundle dtype ("float32", "bfloat16") or a quantization
("int8", "int4": weight-only, float32 activations). Each (variant, round, system) runs in a fresh
subprocess (`exporter.bench.worker`) so start-up costs are real; rounds interleave the systems and the
variants (every variant is prepared first), so a slow spell of this shared machine falls on all of them
rather than on one. HF runs the float variants
only (it has no equivalent of aotpack's quantized bundles); llama.cpp, when `llama_cpp` is importable
and its converter script is given, runs every variant on the same weights converted to GGUF at the
matching precision (f32, bf16, Q8_0, Q4_K_M). The bundle's build time is measured by running
`aotpack export`. The roofline compares aotpack's decode step with the bytes it must read at the
bandwidth measured in the same round, and at the rate torch's own GEMV reads them.
This is a benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

from exporter.bench.build import export_variant, header, machine, measure, random_prompt
from exporter.bench.config import HF_COMPILE_NOTE, BenchConfig
from exporter.bench.llama_cpp import gguf_for
from exporter.bench.report import write_reports
from exporter.bench.roofline import bytes_per_step, gemv_bandwidth, read_bandwidth
from exporter.bench.worker import ONNX_SYSTEMS
from exporter.source import checkpoint_dir
from runtime.format.quant import METHODS
from runtime.format.reader import read_manifest

PARTIAL = "bench.partial.json"


def _keep_partial(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / PARTIAL).write_text(json.dumps(results, indent=2))


def bench_batch1(config: BenchConfig, log=print) -> dict:
    results = header(config) | {
        "variants": list(config.variants),
        "machine": machine(),
        "hf_compile_how": HF_COMPILE_NOTE,
        "runs": [],
        "builds": {},
        "read_rates": [],
        "accuracy": {},
        "llama_cpp_perplexity": {},
    }
    with tempfile.TemporaryDirectory(prefix="aotpack-bench-") as tmp, checkpoint_dir(config.model) as checkpoint:
        from transformers import AutoConfig

        vocab = min(AutoConfig.from_pretrained(checkpoint).get_text_config().vocab_size, 32000)
        prompt = random_prompt(vocab, config.prompt_len)
        variants = {}
        for variant in config.variants:
            variants[variant] = _prepare_variant(config, variant, checkpoint, prompt, Path(tmp), results, log)
            _keep_partial(results, config.out)  # the builds and perplexities survive a later variant's failure
        for round_ in range(config.rounds):
            for variant, (paths, step) in variants.items():
                _bench_round(config, variant, round_, paths, step, prompt, Path(tmp), results, log)
            _keep_partial(results, config.out)
    write_reports(results, config.out)
    (config.out / PARTIAL).unlink(missing_ok=True)
    return results


def _prepare_variant(config: BenchConfig, variant: str, checkpoint: Path, prompt, tmp: Path, results: dict, log):
    """Export the variant's bundle (timed), its GGUF for llama.cpp and llama.cpp's perplexity: (each system's
    model path, the bytes a step reads)."""
    bundle = tmp / f"bundle-{variant}"
    log(f"[{variant}] exporting the bundle")
    onnx = any(s in ONNX_SYSTEMS for s in config.systems_for(variant))
    results["builds"][variant] = export_variant(
        checkpoint, bundle, variant, config.max_cache_len, config.gemv, onnx=onnx
    )
    manifest = read_manifest(bundle)
    results[f"step_bytes_{variant}"] = step = bytes_per_step(manifest, config.prompt_len + config.new_tokens // 2)
    if manifest.accuracy is not None:
        results["accuracy"][variant] = asdict(manifest.accuracy)
    paths = {"aotpack": bundle, "hf_eager": checkpoint, "hf_compile": checkpoint} | dict.fromkeys(ONNX_SYSTEMS, bundle)
    if "llama_cpp" in config.systems_for(variant):
        log(f"[{variant}] converting the checkpoint to GGUF for llama.cpp")
        paths["llama_cpp"] = gguf_for(checkpoint, variant, config.llama_cpp_converter, tmp / "gguf")
        log(f"[{variant}] llama.cpp's perplexity on the accuracy text")
        extra = ["--text", ",".join(map(str, accuracy_ids(checkpoint)))]
        run = measure("llama_cpp", paths["llama_cpp"], variant, prompt, config, tmp / "perplexity", extra)
        results["llama_cpp_perplexity"][variant] = run["perplexity"]
    return paths, step


def _bench_round(config: BenchConfig, variant: str, round_: int, paths, step, prompt, tmp: Path, results, log) -> None:
    """One round of every system on one variant. Rounds go over every variant in turn (round 1 of each, then
    round 2 ...), so the ratios between variants (int4 against int8) meet this machine's slow spells alike:
    the AMD EPYC Zen 4's memory switched between a slow and a fast phase minutes apart, and one variant's
    rounds after another's compared the phases (SmolLM2 int4 0.96x int8 in such a run, 1.25x with the two
    bundles' steps interleaved in one process)."""
    for system in config.systems_for(variant):
        log(f"[{variant}] round {round_ + 1}/{config.rounds}: {system}")
        run = measure(system, paths[system], variant, prompt, config, tmp / f"round{round_}")
        results["runs"].append(run | {"round": round_})
    # Right after the runs: this machine's bandwidth drifts by a third within minutes, so each
    # round's floor is measured next to the decode it is compared with.
    log(f"[{variant}] round {round_ + 1}/{config.rounds}: read bandwidth and torch's GEMV")
    results["read_rates"].append({"dtype": variant, "round": round_} | _read_rates(step, variant, config.threads))


def accuracy_ids(checkpoint: Path) -> list[int]:
    """The token ids a bundle's accuracy report scores (exporter.accuracy): what llama.cpp is scored on."""
    from transformers import AutoConfig, AutoTokenizer

    from exporter.accuracy import text_ids

    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    return text_ids(tokenizer, AutoConfig.from_pretrained(checkpoint, local_files_only=True))


def _read_rates(step: dict, variant: str, threads: int) -> dict:
    """The read bandwidth, and for float variants the rate of torch's own GEMV on the largest weight
    (quantized weights have no torch GEMV to compare with)."""
    rates = {"bandwidth_gb_s": read_bandwidth(step["total_bytes"], threads) / 1e9}
    if variant not in METHODS:
        rows, cols = step["largest_weight"]
        rates["gemv_gb_s"] = gemv_bandwidth(rows, cols, getattr(torch, variant), threads) / 1e9
    return rates
