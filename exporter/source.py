"""Where the checkpoint comes from: a local directory, a hub id already in the local cache, or a preset.

Owns: resolving `aotpack export MODEL` to a local checkpoint directory, without any network access.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path

from exporter.presets import PRESETS, build_preset
from runtime.errors import ExportError


@contextmanager
def checkpoint_dir(model: str):
    """Yield a local checkpoint directory for `model`; a preset lives in a temporary directory."""
    if model in PRESETS:
        with tempfile.TemporaryDirectory(prefix=f"aotpack-{model}-") as tmp:
            yield build_preset(model, Path(tmp))
        return
    path = Path(model).expanduser()
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
            f"{model!r} is neither a directory, a preset ({', '.join(sorted(PRESETS))}) nor a hub id in the local "
            f"cache; aotpack never downloads. Download it first (huggingface-cli download {model}) or pass a directory"
        ) from e
