"""aotpack runtime: load a bundle and generate, with eager prefill and the AOT-compiled decode step.

Runs without the exporter: `from runtime import load`.
"""

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
from runtime.manifest import FORMAT_VERSION, SUPPORTED_VERSIONS, Manifest
from runtime.runtime import Runtime, load

__all__ = [
    "AotpackError",
    "BundleError",
    "CacheOverflowError",
    "EngineClosedError",
    "ExportError",
    "FORMAT_VERSION",
    "ImageInputError",
    "IncompatibleBundleError",
    "IntegrityError",
    "InvalidInputError",
    "Manifest",
    "ManifestError",
    "QueueFullError",
    "Runtime",
    "RuntimeBusyError",
    "SUPPORTED_VERSIONS",
    "load",
]
