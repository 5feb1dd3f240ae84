"""`export()`: checkpoint in, complete bundle out, or no bundle at all.

Owns: the order of the build stages and atomicity. Everything is built in a staging directory beside
the target and renamed into place only after the parity gate passed, so a failed or interrupted
export leaves the target exactly as it was.
"""

from __future__ import annotations

import os
import platform
import shutil
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers

from exporter.compile import compile_decode, export_decode
from exporter.config import ExportConfig
from exporter.constants import StoredTensors, constant_sources
from exporter.decode_step import INPUT_NAMES
from exporter.model import cache_layout, decode_module, is_multimodal, load_model, text_config
from exporter.parity import check_parity
from exporter.source import checkpoint_dir
from runtime.bundle import sha256
from runtime.decode import CompiledDecode
from runtime.errors import ExportError
from runtime.manifest import AOTPACK_VERSION, DECODE, FORMAT_VERSION, MANIFEST, Manifest, Parity


def export(config: ExportConfig, log=print) -> Manifest:
    out = config.out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:  # BaseException too: Ctrl-C must not leave half a bundle behind
        with _signals_abort() as received:
            manifest = _build(config, staging, log)
            if received:  # the interrupt was swallowed somewhere inside the build: do not land
                raise ExportError(f"export interrupted by signal {received[0]}; {out} was left as it was")
            _replace(staging, out)
        return manifest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def _signals_abort():
    """SIGINT and SIGTERM abort the export. The handler raises at once, but CPython drops an exception
    raised while a finalizer (`__del__`) runs, and libraries catch broadly, so the signal is also
    recorded and checked before the bundle is renamed into place."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield received
        return

    def handler(signum, frame):
        received.append(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _replace(staging: Path, out: Path) -> None:
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        out.rename(old)
    staging.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def _build(config: ExportConfig, staging: Path, log) -> Manifest:
    start = time.perf_counter()
    with checkpoint_dir(config.model) as checkpoint:
        model = load_model(checkpoint, config.dtype, config.device)
        preprocessor = _load_preprocessor(checkpoint, is_multimodal(model.config))
    layout = cache_layout(model, config.max_cache_len)
    step = decode_module(model, layout)
    log(f"exporting the decode step of {type(model).__name__} ({len(layout)} layers, cache {config.max_cache_len})")
    exported = export_decode(step, layout, config.batch_size, config.max_cache_len, getattr(torch, config.dtype), config.device)
    log("compiling with AOTInductor")
    package = compile_decode(exported, staging / DECODE, config.device, config.cpu_isa)
    model.save_pretrained(staging)
    preprocessor.save_pretrained(staging)
    manifest = _draft_manifest(config, model, step, layout, package, staging)
    log("checking parity against eager generate")
    decode = CompiledDecode(package, model, manifest)
    tokenizer = getattr(preprocessor, "tokenizer", preprocessor)
    parity = check_parity(model, decode, layout, tokenizer, config.dtype, config.batch_size, config.parity_steps, config.max_cache_len)
    files = {p.name: sha256(p) for p in sorted(staging.iterdir()) if p.is_file()}
    manifest = replace(
        manifest, files=files, parity=parity, build_seconds=round(time.perf_counter() - start, 2),
        built_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    (staging / MANIFEST).write_text(manifest.to_json())
    return manifest


def _draft_manifest(config: ExportConfig, model, step, layout, package: Path, staging: Path) -> Manifest:
    """Everything but the file hashes, timings and parity, which come last."""
    loaded = torch._inductor.aoti_load_package(str(package))
    metadata = loaded.get_metadata()
    constants = constant_sources(step, model, loaded.get_constant_fqns(), StoredTensors(sorted(staging.glob("*.safetensors"))))
    dtype = getattr(torch, config.dtype)
    return Manifest(
        format_version=FORMAT_VERSION, aotpack_version=AOTPACK_VERSION, torch_version=torch.__version__,
        transformers_version=transformers.__version__, python_version=platform.python_version(),
        model_class=type(model).__name__, is_multimodal=is_multimodal(model.config), device=config.device,
        cpu_isa=metadata.get("AOTI_CPU_ISA") if config.device == "cpu" else None, dtype=config.dtype,
        batch_size=config.batch_size, max_cache_len=config.max_cache_len, vocab_size=text_config(model).vocab_size,
        cache_layout=layout, cache_bytes=tuple(layer.nbytes(config.batch_size, dtype) for layer in layout),
        decode_inputs=INPUT_NAMES, constants=constants, files={}, build_seconds=0.0, built_at="",
        parity=Parity(0, 0.0, 0.0, False),
    )


def _load_preprocessor(checkpoint: Path, multimodal: bool):
    from transformers import AutoProcessor, AutoTokenizer

    auto = AutoProcessor if multimodal else AutoTokenizer
    return auto.from_pretrained(checkpoint, local_files_only=True)

