"""aotpack runtime: load a bundle and generate, with eager prefill and the AOT-compiled decode step.

Runs without the exporter: `from runtime import load`. Names that need torch load on first use, so
that `import runtime.errors` (and `aotpack --help`) does not import torch and transformers.
"""

import importlib

from runtime.errors import (
    AotpackError,
    BundleError,
    CacheOverflowError,
    EngineClosedError,
    ExportError,
    ImageInputError,
    IncompatibleBundleError,
    IntegrityError,
    InvalidInputError,
    ManifestError,
    QueueFullError,
    RuntimeBusyError,
)

_LAZY = {
    "FORMAT_VERSION": "runtime.format.manifest",
    "SUPPORTED_VERSIONS": "runtime.format.manifest",
    "Manifest": "runtime.format.manifest",
    "LoadConfig": "runtime.config",
    "FinishReason": "runtime.engine.status",
    "Runtime": "runtime.runtime",
    "load": "runtime.runtime",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")


__all__ = [
    "AotpackError",
    "BundleError",
    "CacheOverflowError",
    "EngineClosedError",
    "ExportError",
    "FORMAT_VERSION",
    "FinishReason",
    "ImageInputError",
    "IncompatibleBundleError",
    "IntegrityError",
    "InvalidInputError",
    "LoadConfig",
    "Manifest",
    "ManifestError",
    "QueueFullError",
    "Runtime",
    "RuntimeBusyError",
    "SUPPORTED_VERSIONS",
    "load",
]
